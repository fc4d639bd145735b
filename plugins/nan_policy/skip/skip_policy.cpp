// NaN policy "skip": drop a step with a non-finite loss or gradient (or a spike, when enabled);
// abort after a long streak. on_spike=clip applies a finite spike with its gradient norm clipped.
#include <ampkit/device_rules.h>
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy_plugin.h>

namespace {

class SkipNanPolicy final : public ampkit::DetectingNanPolicy {
 public:
  explicit SkipNanPolicy(const ampkit::OptionValues& options)
      : DetectingNanPolicy(options, options.get_int("max_consecutive")),
        clip_spikes_(options.get_string("on_spike") == "clip"),
        offers_rule_(!ampkit::detects_spikes(options)) {
    rule_.max_consecutive = options.get_int("max_consecutive");
  }

  // decide() below without spikes, as numbers for the device (device_rules.h): both run its rule.
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kNanPolicyDeviceRule, offers_rule_ ? &rule_ : nullptr);
  }

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detect(stats);
    if (!d) return {};
    ampkit::NanDecision clipped;
    if (clip_spikes_ && clip_spike(d, clipped)) return clipped;
    return decide_by_rule(ampkit::step_rule_of(rule_), stats, d);
  }

 private:
  bool clip_spikes_;
  bool offers_rule_;
  ampkit::NanPolicyDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, skip, SkipNanPolicy,
              "Skip steps with non-finite loss or gradients (or spikes); abort after N in a row",
              ampkit::OptionSpec::Int("max_consecutive", "50",
                                      "Abort the run with a report after this many consecutive "
                                      "skipped steps; 0 never aborts.")
                  .min(0),
              ampkit::OptionSpec::Choice("on_spike", "skip", "skip|clip", AMPKIT_ON_SPIKE_HELP),
              AMPKIT_NAN_DETECTOR_OPTIONS)
