// NaN policy "backoff": skip a bad step and, for non-finite gradients, ask the scaler for one
// extra backoff (overflow seen twice as fast); abort after a long streak.
#include <string>

#include <ampkit/nan_detector.h>
#include <ampkit/plugin.h>

namespace {

class BackoffNanPolicy final : public ampkit::NanPolicy {
 public:
  explicit BackoffNanPolicy(const ampkit::OptionValues& options)
      : detector_(options), max_consecutive_(options.get_int("max_consecutive")) {}

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    const ampkit::Detection d = detector_.detect(stats);
    if (!d) return {};
    const int64_t streak = stats.consecutive_skips + 1;
    if (max_consecutive_ > 0 && streak >= max_consecutive_)
      return {ampkit::NanAction::abort, d.what + "; " + std::to_string(streak) +
                                            " consecutive bad steps (nan_policy.max_consecutive=" +
                                            std::to_string(max_consecutive_) + "): the loss is probably diverging"};
    // A spike is not an overflow: a smaller scale would not have prevented it.
    if (d.non_finite()) return {ampkit::NanAction::skip_backoff, d.what + "; extra scaler backoff"};
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

AMPKIT_PLUGIN(nan_policy, backoff, BackoffNanPolicy,
              "Skip bad steps and back the loss scale off once more on overflow; abort after N in a row",
              ampkit::OptionSpec::Int("max_consecutive", "20",
                                      "Abort the run with a report after this many consecutive "
                                      "skipped steps; 0 never aborts.")
                  .min(0),
              AMPKIT_NAN_DETECTOR_OPTIONS)
