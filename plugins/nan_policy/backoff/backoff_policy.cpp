// NaN policy "backoff": skip a bad step and, for non-finite values, ask the scaler for one
// extra backoff (overflow seen twice as fast); abort after a long streak.
#include <ampkit/device_rules.h>
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy_plugin.h>

namespace {

class BackoffNanPolicy final : public ampkit::DetectingNanPolicy {
 public:
  explicit BackoffNanPolicy(const ampkit::OptionValues& options)
      : DetectingNanPolicy(options, options.get_int("max_consecutive")),
        clip_spikes_(options.get_string("on_spike") == "clip"),
        offers_rule_(!ampkit::detects_spikes(options)) {
    rule_.backoff = true;
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

AMPKIT_PLUGIN(nan_policy, backoff, BackoffNanPolicy,
              "Skip bad steps and back the loss scale off once more on overflow; abort after N in a row",
              ampkit::OptionSpec::Int("max_consecutive", "20",
                                      "Abort the run with a report after this many consecutive "
                                      "skipped steps; 0 never aborts.")
                  .min(0),
              ampkit::OptionSpec::Choice("on_spike", "skip", "skip|clip", AMPKIT_ON_SPIKE_HELP),
              AMPKIT_NAN_DETECTOR_OPTIONS)
