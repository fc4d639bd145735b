// Clipper "ema_norm", the plugin docs/plugin-authoring.md writes step by step: clip the unscaled
// total gradient norm at `factor` times its exponential moving average, so the threshold follows
// the run instead of being guessed up front.
#include <ampkit/clipper_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

class EmaNormClipper final : public ampkit::GradClipper {
 public:
  // The host has already checked every option against its spec (ranges, types), so the
  // constructor only reads them; it throws for what a spec cannot say.
  explicit EmaNormClipper(const ampkit::OptionValues& options)
      : factor_(options.get_float("factor")),
        beta_(options.get_float("beta")),
        warmup_steps_(options.get_int("warmup_steps")) {}

  ampkit::ClipResult clip(const ampkit::StepStats& stats) override {
    const double norm = stats.grad_norm;  // already unscaled: a clipper never sees the loss scale
    if (!std::isfinite(norm)) return {1.0, threshold()};  // the engine skips such steps anyway
    if (seen_ < warmup_steps_) {
      // Plain running mean while warming up: an EMA started at the first norm would trust it too much.
      ++seen_;
      average_ += (norm - average_) / static_cast<double>(seen_);
      return {1.0, 0.0};
    }
    const double limit = threshold();
    // Same form as clip_grad_norm_: coefficient max / (norm + 1e-6), never above 1.
    const double coefficient = std::min(1.0, limit / (norm + 1e-6));
    // The average follows the clipped norm, so one spike cannot raise the threshold for long.
    average_ = beta_ * average_ + (1.0 - beta_) * std::min(norm, limit);
    ++seen_;
    return {coefficient, limit};
  }

  // Everything clip() depends on besides the options, so a resumed run continues exactly.
  ampkit::State save() const override {
    ampkit::State s;
    s.set("average", average_);
    s.set("seen", seen_);
    return s;
  }
  void load(const ampkit::State& s) override {
    const double average = s.get<double>("average");  // throws naming a missing or mistyped key
    const int64_t seen = s.get<int64_t>("seen");
    if (!(average >= 0.0) || seen < 0)
      throw std::runtime_error("clipper 'ema_norm': checkpoint state average=" + std::to_string(average) +
                               " seen=" + std::to_string(seen) + " is not one this plugin writes");
    average_ = average;
    seen_ = seen;
  }

 private:
  double threshold() const { return factor_ * average_; }

  double factor_;
  double beta_;
  int64_t warmup_steps_;
  double average_ = 0.0;
  int64_t seen_ = 0;
};

}  // namespace

AMPKIT_PLUGIN(
    clipper, ema_norm, EmaNormClipper,
    "Clip the total norm at factor x its moving average (example plugin from the ampkit SDK)",
    ampkit::OptionSpec::Float("factor", "2", "Clip when the norm exceeds this multiple of its average.")
        .min(1.0, true),
    ampkit::OptionSpec::Float("beta", "0.98", "Weight of the old average in each EMA update.")
        .min(0.0, true)
        .max(1.0, true),
    ampkit::OptionSpec::Int("warmup_steps", "10", "Steps that only measure the norm; no clipping.").min(1))
