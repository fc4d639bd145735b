// NaN policy "abort": stop the run at the first bad step, for runs where a NaN means a bug
// (torchtitan's behaviour); the host writes the summary with the reason and exits 5.
#include <ampkit/device_rules.h>
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy_plugin.h>

namespace {

class AbortNanPolicy final : public ampkit::DetectingNanPolicy {
 public:
  explicit AbortNanPolicy(const ampkit::OptionValues& options)
      : DetectingNanPolicy(options, 0),
        tolerate_overflow_(options.get_bool("tolerate_overflow")),
        offers_rule_(!ampkit::detects_spikes(options)) {
    rule_.abort_on_nonfinite_loss = true;
    rule_.abort_on_nonfinite_gradients = !tolerate_overflow_;
  }

  // decide() below without spikes, as numbers for the device (device_rules.h): both run its rule.
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kNanPolicyDeviceRule, offers_rule_ ? &rule_ : nullptr);
  }

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detect(stats);
    if (!d) return {};
    if (!d.non_finite()) return {ampkit::NanAction::abort, d.what};  // a spike stops the run too
    // With a dynamic scaler, overflowing gradients at a too-large scale are routine, not a bug:
    // the rule skips them where tolerate_overflow clears its abort_on_nonfinite_gradients.
    ampkit::NanDecision out = decide_by_rule(ampkit::step_rule_of(rule_), stats, d);
    if (out.action == ampkit::NanAction::skip) out.reason += " (tolerated: nan_policy.tolerate_overflow)";
    return out;
  }

 private:
  bool tolerate_overflow_;
  bool offers_rule_;
  ampkit::NanPolicyDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(
    nan_policy, abort, AbortNanPolicy, "Stop the run with a report at the first bad step",
    ampkit::OptionSpec::Bool(
        "tolerate_overflow", "true",
        "Skip (do not abort) steps whose loss is finite but whose "
        "gradients overflowed (routine for a dynamic loss scaler); a non-finite loss always aborts."),
    AMPKIT_NAN_DETECTOR_OPTIONS)
