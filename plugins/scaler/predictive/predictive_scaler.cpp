// Scaler "predictive": a power-of-two scale that keeps the predicted largest gradient under fp16's limit.
#include <ampkit/scaler_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../scaler_option_checks.h"

namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr double kHalfMax = 65504.0;  // largest finite fp16 value

using ampkit::format_number;

const ampkit::scaler::ScalerOptionChecks kChecks("predictive");

bool is_power_of_two(double v) {
  int exponent = 0;
  return v > 0.0 && std::isfinite(v) && std::frexp(v, &exponent) == 0.5;
}

// Largest power of two <= v, for a positive finite v.
double floor_power_of_two(double v) {
  int exponent = 0;
  std::frexp(v, &exponent);  // v = m * 2^exponent with m in [0.5, 1)
  return std::ldexp(1.0, exponent - 1);
}

class PredictiveLossScaler final : public ampkit::LossScaler {
 public:
  explicit PredictiveLossScaler(const ampkit::OptionValues& options)
      : capacity_(options.get_int("history")),
        growth_margin_(options.get_float("growth_margin")),
        margin_(options.get_float("margin")),
        max_growth_(options.get_float("max_growth")),
        backoff_factor_(options.get_float("backoff_factor")),
        min_scale_(options.get_float("min_scale")),
        max_scale_(options.get_float("max_scale")),
        cooldown_(options.get_int("overflow_cooldown")) {
    const double init = options.get_float("init_scale");
    if (capacity_ < 1 || capacity_ > kMaxHistory)
      throw kChecks.bad_option("history", std::to_string(capacity_),
                               "in [1, " + std::to_string(kMaxHistory) + "]");
    if (!(growth_margin_ >= 1.0) || !std::isfinite(growth_margin_))
      throw kChecks.bad_option("growth_margin", format_number(growth_margin_),
                               ">= 1 (a prediction below the recent maximum)");
    if (!(margin_ >= 1.0) || !(margin_ < kHalfMax))
      throw kChecks.bad_option("margin", format_number(margin_), "in [1, 65504) (a share of fp16's range)");
    if (!(max_growth_ >= 2.0) || !std::isfinite(max_growth_))
      throw kChecks.bad_option("max_growth", format_number(max_growth_),
                               ">= 2 (the scale moves by powers of two)");
    kChecks.check_backoff_factor(backoff_factor_);
    if (cooldown_ < 0) throw kChecks.bad_option("overflow_cooldown", std::to_string(cooldown_), ">= 0");
    error_at_min_ = kChecks.error_at_min_scale(options);
    // Powers of two make loss * scale and grad / scale exact in every float format, so the
    // scale never changes what the optimizer sees; the bounds must keep that true.
    for (const auto& [name, v] : {std::pair<const char*, double>{"init_scale", init},
                                  {"min_scale", min_scale_},
                                  {"max_scale", max_scale_}})
      if (!is_power_of_two(v) || v > kFloatMax)
        throw kChecks.bad_option(name, format_number(v),
                                 "a power of two no larger than 2^127 (exact unscaling)");
    kChecks.check_scale_order<double>(init, min_scale_, max_scale_);
    scale_ = init;
    ceiling_ = max_scale_;
    history_.reserve(static_cast<size_t>(capacity_));
  }

  double scale() const override { return scale_; }
  bool is_dynamic() const override { return true; }

  void update(const ampkit::StepStats& stats) override {
    if (stats.found_inf || !std::isfinite(stats.grad_max_abs)) {
      // The step's largest gradient is unknown (inf/NaN): the history stays as it was, and the
      // overflow itself says the scale was too high for something the history does not see.
      back_off();
      return;
    }
    record(stats.grad_max_abs);
    if (cooldown_left_ > 0 && --cooldown_left_ == 0) ceiling_ = max_scale_;

    // Prediction: the next step's largest gradient is at most growth_margin times the largest
    // of the recent ones; the scale keeps that prediction margin times below fp16's limit.
    const double predicted = *std::max_element(history_.begin(), history_.end()) * growth_margin_;
    const double room = kHalfMax / margin_;
    double next = max_scale_;
    if (predicted > 0.0 && std::isfinite(room / predicted))
      next = std::min(next, floor_power_of_two(room / predicted));
    // A fall in the prediction is followed at once (it prevents an overflow); a rise is followed
    // at most max_growth per step, so one quiet step cannot send the scale to the ceiling.
    next = std::min(next, floor_power_of_two(scale_ * max_growth_));
    next = std::min(next, ceiling_);
    // A prediction below min_scale is not an overflow: hold the floor and let a real one decide.
    scale_ = std::max(next, min_scale_);
  }

  // Asked for by a NaN policy (skip_backoff): one reduction now, with the same cooldown.
  void backoff() override { back_off(); }

  ampkit::State save() const override {
    ampkit::State s;
    s.set("scale", scale_);
    s.set("ceiling", ceiling_);
    s.set("cooldown_left", cooldown_left_);
    s.set("history", history_in_order());
    return s;
  }

  void load(const ampkit::State& state) override {
    const double scale = state.get<double>("scale");
    const double ceiling = state.get<double>("ceiling");
    const int64_t cooldown_left = state.get<int64_t>("cooldown_left");
    std::vector<double> history = state.get<std::vector<double>>("history");
    const std::string bounds = "[" + format_number(min_scale_) + ", " + format_number(max_scale_) + "]";
    if (!is_power_of_two(scale) || scale < min_scale_ || scale > max_scale_)
      throw std::runtime_error("scaler 'predictive': checkpoint scale " + format_number(scale) +
                               " is not a power of two in this run's " + bounds +
                               " (scaler.min_scale, scaler.max_scale)");
    if (!is_power_of_two(ceiling) || ceiling < min_scale_ || ceiling > max_scale_)
      throw std::runtime_error("scaler 'predictive': checkpoint ceiling " + format_number(ceiling) +
                               " is not a power of two in " + bounds);
    if (cooldown_left < 0 || cooldown_left > cooldown_)
      throw std::runtime_error("scaler 'predictive': checkpoint cooldown_left " +
                               std::to_string(cooldown_left) + " is outside [0, " +
                               std::to_string(cooldown_) +
                               "] for scaler.overflow_cooldown=" + std::to_string(cooldown_));
    for (double v : history)
      if (!(v >= 0.0) || !std::isfinite(v))
        throw std::runtime_error("scaler 'predictive': checkpoint history holds " + format_number(v) +
                                 "; gradient maxima are finite and >= 0");
    // A run resumed with a shorter history keeps the newest entries, as if it had always had it.
    if (static_cast<int64_t>(history.size()) > capacity_)
      history.erase(history.begin(), history.end() - capacity_);
    scale_ = scale;
    ceiling_ = ceiling;
    cooldown_left_ = cooldown_left;
    history_ = std::move(history);
    history_.reserve(static_cast<size_t>(capacity_));
    next_ = history_.size() % static_cast<size_t>(capacity_);
  }

 private:
  static constexpr int64_t kMaxHistory = 1 << 16;

  // The same rule as `dynamic`: a reduction past min_scale stops there; one asked for at
  // min_scale means even the smallest allowed scale overflows.
  void back_off() {
    if (scale_ <= min_scale_ && error_at_min_)
      throw ampkit::TrainingAborted(
          "scaler 'predictive': gradients overflow at the minimum loss scale " + format_number(min_scale_) +
          " (scaler.min_scale); the loss is probably exploding: lower the learning rate, clip gradients, "
          "use bf16, or set scaler.on_min_scale=clamp to keep skipping steps at the minimum");
    scale_ = std::max(floor_power_of_two(scale_ * backoff_factor_), min_scale_);
    // Until overflow_cooldown clean steps pass, the prediction may not lead back up to the scale
    // that just overflowed: without this the scale would alternate between overflow and backoff.
    ceiling_ = cooldown_ > 0 ? scale_ : max_scale_;
    cooldown_left_ = cooldown_;
  }

  // Ring buffer: history_ grows to capacity_, then next_ walks over it overwriting the oldest.
  void record(double max_abs) {
    if (static_cast<int64_t>(history_.size()) < capacity_) {
      history_.push_back(max_abs);
    } else {
      history_[next_] = max_abs;
    }
    next_ = (next_ + 1) % static_cast<size_t>(capacity_);
  }

  std::vector<double> history_in_order() const {
    if (static_cast<int64_t>(history_.size()) < capacity_) return history_;
    std::vector<double> ordered(history_.begin() + static_cast<std::ptrdiff_t>(next_), history_.end());
    ordered.insert(ordered.end(), history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(next_));
    return ordered;
  }

  int64_t capacity_;
  double growth_margin_;
  double margin_;
  double max_growth_;
  double backoff_factor_;
  double min_scale_;
  double max_scale_;
  int64_t cooldown_;
  bool error_at_min_;
  double scale_ = 0;
  double ceiling_ = 0;
  int64_t cooldown_left_ = 0;
  std::vector<double> history_;  // unscaled max |g| of the last finite steps
  size_t next_ = 0;              // slot the next entry goes to once history_ is full
};

}  // namespace

AMPKIT_PLUGIN(
    scaler, predictive, PredictiveLossScaler,
    "Power-of-two scale chosen from recent gradient maxima to stay under fp16's limit before it overflows",
    ampkit::OptionSpec::Float("init_scale", "1024",
                              "Scale of the first step, before any gradient was measured; low because one "
                              "finite step is all the prediction needs, and it climbs max_growth per step.")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Int("history", "16",
                            "Finite steps whose largest unscaled |gradient| is remembered; the prediction "
                            "uses their maximum, so a spike is remembered this many steps.")
        .min(1)
        .max(65536),
    ampkit::OptionSpec::Float("growth_margin", "2",
                              "Factor the next step's largest gradient may exceed the remembered maximum by "
                              "without overflowing (gradients rarely double in one step).")
        .min(1.0),
    ampkit::OptionSpec::Float("margin", "64",
                              "Headroom under fp16's 65504 for what the history cannot see: activation "
                              "gradients in the backward can exceed the parameter gradients it measures "
                              "(by up to 90x on a CLIP-style model; docs/loss-scaling.md).")
        .min(1.0)
        .max(kHalfMax, true),
    ampkit::OptionSpec::Float("max_growth", "2",
                              "Largest factor (rounded down to a power of two) the scale grows by in one "
                              "step when the prediction allows more; falls are followed at once.")
        .min(2.0),
    ampkit::OptionSpec::Float(
        "backoff_factor", "0.5",
        "Factor the scale shrinks by on an actual overflow, rounded down to a power of two.")
        .min(0.0, true)
        .max(1.0, true),
    ampkit::OptionSpec::Int("overflow_cooldown", "100",
                            "Steps after an overflow during which the scale stays at or below its backed-off "
                            "value; frequent overflows mean margin is too small.")
        .min(0),
    ampkit::OptionSpec::Float("min_scale", "1",
                              "Floor of the scale, a power of two: a scale below 1 is needed only when the "
                              "unscaled gradients overflow fp16, which scaling cannot cure.")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Float(
        "max_scale", "16777216",
        "Ceiling, a power of two: 2^24 lifts fp16's smallest subnormal gradient 2^-24 "
        "to 1, more buys nothing (Apex's max_loss_scale); it also bounds all-zero steps.")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Choice("on_min_scale", "error", "error|clamp",
                               "When an overflow asks for a backoff at min_scale: error stops the run (loss "
                               "probably exploding), clamp keeps skipping steps at min_scale."))
