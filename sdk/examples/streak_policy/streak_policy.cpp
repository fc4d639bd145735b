// NaN policy "bad_streak": skips a bad step (non-finite loss or gradients) and aborts the run when
// `max_streak` steps in a row were bad, or when bad steps exceed `max_fraction` of the steps so
// far (after `min_steps`). Checkpointed: the counts survive a resume.
#include <ampkit/nan_policy_plugin.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

class StreakPolicy final : public ampkit::NanPolicy {
 public:
  explicit StreakPolicy(const ampkit::OptionValues& o)
      : max_streak_(o.get_int("max_streak")),
        max_fraction_(o.get_float("max_fraction")),
        min_steps_(o.get_int("min_steps")) {}

  ampkit::NanDecision decide(const ampkit::StepStats& s) override {
    ++steps_;
    ampkit::NanDecision d;
    if (!s.found_inf && s.loss_finite) return d;
    ++bad_;
    const int64_t streak = s.consecutive_skips + 1;
    if (streak >= max_streak_) {
      d.action = ampkit::NanAction::abort;
      d.reason =
          std::to_string(streak) + " bad steps in a row (max_streak " + std::to_string(max_streak_) + ")";
    } else if (steps_ >= min_steps_ &&
               static_cast<double>(bad_) > max_fraction_ * static_cast<double>(steps_)) {
      d.action = ampkit::NanAction::abort;
      d.reason = std::to_string(bad_) + " of " + std::to_string(steps_) + " steps were bad (max_fraction " +
                 ampkit::format_number(max_fraction_) + ")";
    } else {
      d.action = ampkit::NanAction::skip;
      d.reason = "non-finite loss or gradients";
    }
    return d;
  }

  ampkit::State save() const override {
    ampkit::State s;
    s.set("steps", steps_);
    s.set("bad", bad_);
    return s;
  }
  void load(const ampkit::State& s) override {
    const int64_t steps = s.get<int64_t>("steps"), bad = s.get<int64_t>("bad");
    if (steps < 0 || bad < 0 || bad > steps)
      throw std::invalid_argument("nan_policy 'bad_streak': inconsistent state (bad > steps)");
    steps_ = steps;
    bad_ = bad;
  }

 private:
  int64_t max_streak_;
  double max_fraction_;
  int64_t min_steps_;
  int64_t steps_ = 0, bad_ = 0;
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, bad_streak, StreakPolicy,
              "Skips bad steps; aborts on a streak or a high bad fraction",
              ampkit::OptionSpec::Int("max_streak", "5", "Bad steps in a row that abort the run.").min(1),
              ampkit::OptionSpec::Float("max_fraction", "0.1", "Fraction of bad steps that aborts the run.")
                  .min(0.0, true)
                  .max(1.0),
              ampkit::OptionSpec::Int("min_steps", "20", "Steps seen before max_fraction is judged.").min(1))
