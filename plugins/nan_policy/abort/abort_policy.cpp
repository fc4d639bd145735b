// NaN policy "abort": stop the run at the first bad step, for runs where a NaN means a bug
// (torchtitan's behaviour); the host writes the summary with the reason and exits 5.
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy_plugin.h>

namespace {

class AbortNanPolicy final : public ampkit::DetectingNanPolicy {
 public:
  explicit AbortNanPolicy(const ampkit::OptionValues& options)
      : DetectingNanPolicy(options, 0), tolerate_overflow_(options.get_bool("tolerate_overflow")) {}

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detect(stats);
    if (!d) return {};
    // With a dynamic scaler, overflowing gradients at a too-large scale are routine, not a bug.
    if (tolerate_overflow_ && d.kind == ampkit::Detection::Kind::nonfinite_gradients)
      return {ampkit::NanAction::skip, d.what + " (tolerated: nan_policy.tolerate_overflow)"};
    return {ampkit::NanAction::abort, d.what};
  }

 private:
  bool tolerate_overflow_;
};

}  // namespace

AMPKIT_PLUGIN(
    nan_policy, abort, AbortNanPolicy, "Stop the run with a report at the first bad step",
    ampkit::OptionSpec::Bool(
        "tolerate_overflow", "true",
        "Skip (do not abort) steps whose loss is finite but whose "
        "gradients overflowed (routine for a dynamic loss scaler); a non-finite loss always aborts."),
    AMPKIT_NAN_DETECTOR_OPTIONS)
