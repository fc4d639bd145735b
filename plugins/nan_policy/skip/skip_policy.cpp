// NaN policy "skip": drop a step with a non-finite loss or gradient (or a spike, when enabled);
// abort after a long streak.
#include <string>

#include <ampkit/nan_detector.h>
#include <ampkit/plugin.h>

namespace {

class SkipNanPolicy final : public ampkit::NanPolicy {
 public:
  explicit SkipNanPolicy(const ampkit::OptionValues& options)
      : detector_(options), max_consecutive_(options.get_int("max_consecutive")) {}

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detector_.detect(stats);
    if (!d) return {};
    const int64_t streak = stats.consecutive_skips + 1;
    if (max_consecutive_ > 0 && streak >= max_consecutive_)
      return {ampkit::NanAction::abort, d.what + "; " + std::to_string(streak) +
                                            " consecutive bad steps (nan_policy.max_consecutive=" +
                                            std::to_string(max_consecutive_) + "): the loss is probably diverging"};
    return {ampkit::NanAction::skip, d.what};
  }
  ampkit::State save() const override {
    ampkit::State s;
    detector_.save(s);
    return s;
  }
  void load(const ampkit::State& s) override { detector_.load(s); }

 private:
  ampkit::NanDetector detector_;
  int64_t max_consecutive_;
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, skip, SkipNanPolicy,
              "Skip steps with non-finite loss or gradients (or spikes); abort after N in a row",
              ampkit::OptionSpec::Int("max_consecutive", "50",
                                      "Abort the run with a report after this many consecutive "
                                      "skipped steps; 0 never aborts.")
                  .min(0),
              AMPKIT_NAN_DETECTOR_OPTIONS)
