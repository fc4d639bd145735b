// NaN policy "skip": drop a step with a non-finite loss or gradient; abort after a long streak.
#include <string>

#include <ampkit/plugin.h>

namespace {

class SkipNanPolicy final : public ampkit::NanPolicy {
 public:
  explicit SkipNanPolicy(const ampkit::OptionValues& options)
      : max_consecutive_(options.get_int("max_consecutive")) {}

  ampkit::NanDecision decide(const ampkit::StepStats& stats) override {
    if (!stats.found_inf) return {};
    const std::string what = stats.loss_finite ? "non-finite gradients" : "non-finite loss";
    const int64_t streak = stats.consecutive_skips + 1;
    if (max_consecutive_ > 0 && streak >= max_consecutive_)
      return {ampkit::NanAction::abort,
              what + " in " + std::to_string(streak) +
                  " consecutive steps (nan_policy.max_consecutive=" +
                  std::to_string(max_consecutive_) + "); the loss is probably diverging"};
    return {ampkit::NanAction::skip, what + " at scale " + std::to_string(stats.scale)};
  }

 private:
  int64_t max_consecutive_;
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, skip, SkipNanPolicy,
              "Skip steps with non-finite loss or gradients; abort after N in a row",
              ampkit::OptionSpec::Int("max_consecutive", "50",
                                      "Abort the run with a report after this many consecutive "
                                      "skipped steps; 0 never aborts.")
                  .min(0))
