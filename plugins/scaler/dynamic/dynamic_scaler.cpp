// Scaler "dynamic": torch.amp.GradScaler's loss scale, bit for bit, plus Megatron's hysteresis and bounds.
#include <ampkit/device_rules.h>
#include <ampkit/scaler_plugin.h>
#include <ampkit/step_rules.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "../scaler_option_checks.h"

namespace {

constexpr double kFloatMax = std::numeric_limits<float>::max();

using ampkit::format_number;

const ampkit::scaler::ScalerOptionChecks kChecks("dynamic");

class DynamicLossScaler final : public ampkit::LossScaler {
 public:
  explicit DynamicLossScaler(const ampkit::OptionValues& options)
      : growth_factor_(options.get_float("growth_factor")),
        backoff_factor_(options.get_float("backoff_factor")),
        growth_interval_(options.get_int("growth_interval")),
        growth_delay_(options.get_int("growth_delay")),
        hysteresis_(options.get_int("hysteresis")) {
    // The host checks each option against its declared range; these checks repeat that for
    // callers that build OptionValues themselves, and add the checks that span two options.
    const double init = options.get_float("init_scale");
    const double min = options.get_float("min_scale");
    const double max = options.get_float("max_scale");
    if (!(growth_factor_ > 1.0) || !std::isfinite(growth_factor_))
      throw kChecks.bad_option("growth_factor", format_number(growth_factor_),
                               "> 1 (a factor <= 1 would never grow the scale)");
    kChecks.check_backoff_factor(backoff_factor_);
    if (growth_interval_ < 1)
      throw kChecks.bad_option("growth_interval", std::to_string(growth_interval_), ">= 1");
    if (growth_delay_ < 0) throw kChecks.bad_option("growth_delay", std::to_string(growth_delay_), ">= 0");
    if (hysteresis_ < 1) throw kChecks.bad_option("hysteresis", std::to_string(hysteresis_), ">= 1");
    error_at_min_ = kChecks.error_at_min_scale(options);
    for (const auto& [name, v] :
         {std::pair<const char*, double>{"init_scale", init}, {"min_scale", min}, {"max_scale", max}})
      if (!(v > 0.0 && v <= kFloatMax) || static_cast<float>(v) == 0.0f)
        throw kChecks.bad_option(name, format_number(v),
                                 "in (0, " + format_number(kFloatMax) + "] (a positive float32)");
    // The scale is a float32, as GradScaler's is; the bounds are compared in the same type.
    kChecks.check_scale_order<float>(init, min, max);
    min_scale_ = static_cast<float>(min);
    max_scale_ = static_cast<float>(max);
    rule_.kind = ampkit::ScalerDeviceRule::Kind::dynamic;
    rule_.growth_factor = growth_factor_;
    rule_.backoff_factor = backoff_factor_;
    rule_.growth_interval = growth_interval_;
    rule_.hysteresis = hysteresis_;
    rule_.min_scale = min_scale_;
    rule_.max_scale = max_scale_;
    rule_.abort_at_min_scale = error_at_min_;
    rule_.growth_delay = growth_delay_;
    step_rule_ = ampkit::step_rule_of(rule_);
    state_ = {static_cast<float>(init), -growth_delay_, hysteresis_};
  }

  // The same rule on the device (device_rules.h): update() and backoff() run its functions.
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kScalerDeviceRule, &rule_);
  }

  double scale() const override { return state_.scale; }
  bool is_dynamic() const override { return true; }

  // The rule (step_rules.h): an overflow spends hysteresis and backs off once it is spent, clean
  // steps grow the scale every growth_interval.
  void update(const ampkit::StepStats& stats) override {
    if (ampkit_dynamic_scaler_update(&step_rule_, &state_, stats.found_inf ? 1 : 0)) throw overflow_at_min();
  }

  // Asked for by a NaN policy (skip_backoff): one reduction now, whatever the hysteresis says.
  void backoff() override {
    if (ampkit_dynamic_scaler_backoff(&step_rule_, &state_)) throw overflow_at_min();
  }

  ampkit::State save() const override {
    ampkit::State s;
    s.set("scale", static_cast<double>(state_.scale));
    s.set("growth_tracker", static_cast<int64_t>(state_.growth_tracker));
    s.set("hysteresis_tracker", static_cast<int64_t>(state_.hysteresis_tracker));
    return s;
  }

  void load(const ampkit::State& state) override {
    const double scale = state.get<double>("scale");
    const int64_t growth = state.get<int64_t>("growth_tracker");
    const int64_t hysteresis = state.get<int64_t>("hysteresis_tracker");
    if (!(scale > 0.0 && scale <= kFloatMax) || static_cast<double>(static_cast<float>(scale)) != scale)
      throw std::runtime_error("scaler 'dynamic': checkpoint scale " + format_number(scale) +
                               " is not a positive finite float32");
    if (static_cast<float>(scale) < min_scale_ || static_cast<float>(scale) > max_scale_)
      throw std::runtime_error("scaler 'dynamic': checkpoint scale " + format_number(scale) +
                               " is outside this run's [" + format_number(min_scale_) + ", " +
                               format_number(max_scale_) + "] (scaler.min_scale, scaler.max_scale)");
    // The count restarts at -growth_delay after an overflow, at 0 after a growth.
    if (growth < -growth_delay_ || growth >= growth_interval_)
      throw std::runtime_error(
          "scaler 'dynamic': checkpoint growth_tracker " + std::to_string(growth) + " is outside [" +
          std::to_string(-growth_delay_) + ", " + std::to_string(growth_interval_ - 1) +
          "] for scaler.growth_interval=" + std::to_string(growth_interval_) +
          (growth_delay_ > 0 ? ", scaler.growth_delay=" + std::to_string(growth_delay_) : ""));
    if (hysteresis < 0 || hysteresis > hysteresis_)
      throw std::runtime_error("scaler 'dynamic': checkpoint hysteresis_tracker " +
                               std::to_string(hysteresis) + " is outside [0, " + std::to_string(hysteresis_) +
                               "] for scaler.hysteresis=" + std::to_string(hysteresis_));
    state_ = {static_cast<float>(scale), growth, hysteresis};
  }

 private:
  // DeepSpeed's rule: a reduction that would pass min_scale stops at it; one asked for while
  // already there means even scale min_scale overflows, which scaling cannot fix.
  ampkit::TrainingAborted overflow_at_min() const {
    return ampkit::TrainingAborted(
        "scaler 'dynamic': gradients overflow at the minimum loss scale " + format_number(min_scale_) +
        " (scaler.min_scale); the loss is probably exploding: lower the learning rate, clip gradients, "
        "use bf16, or set scaler.on_min_scale=clamp to keep skipping steps at the minimum");
  }

  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t growth_delay_;
  int64_t hysteresis_;
  bool error_at_min_;
  float min_scale_ = 0;
  float max_scale_ = 0;
  ampkit::ScalerDeviceRule rule_;  // what the device is told
  ampkit_dynamic_scaler_rule step_rule_{};
  ampkit_dynamic_scaler_state state_{};
};

}  // namespace

AMPKIT_PLUGIN(
    scaler, dynamic, DynamicLossScaler,
    "torch.amp.GradScaler's dynamic loss scale (exact), with optional hysteresis and bounds",
    ampkit::OptionSpec::Float("init_scale", "65536",
                              "Scale of the first step (GradScaler's 2**16); it is held as a float32.")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Float("growth_factor", "2",
                              "Factor the scale grows by after growth_interval clean steps in a row; a "
                              "growth whose float32 result is not finite is refused.")
        .min(1.0, true),
    ampkit::OptionSpec::Float("backoff_factor", "0.5",
                              "Factor the scale shrinks by when a step overflows (after hysteresis "
                              "overflows); powers of two keep the unscale exact.")
        .min(0.0, true)
        .max(1.0, true),
    ampkit::OptionSpec::Int(
        "growth_interval", "2000",
        "Clean steps in a row after which the scale grows; an overflow restarts the count.")
        .min(1),
    ampkit::OptionSpec::Int(
        "growth_delay", "0",
        "Extra clean steps needed before the first growth of the run and the first growth "
        "after each overflow: DeepSpeed 0.17.1 counts one more (1); 0 is GradScaler.")
        .min(0),
    ampkit::OptionSpec::Int("hysteresis", "1",
                            "Overflows tolerated before the scale backs off (Megatron-LM); the count is "
                            "restored only when growth_interval clean steps pass; 1 is GradScaler.")
        .min(1),
    ampkit::OptionSpec::Float(
        "min_scale", "1",
        "Floor of the scale: a scale below 1 is needed only when the unscaled gradients "
        "overflow fp16, which scaling cannot cure (Megatron and DeepSpeed use 1).")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Float("max_scale", "3.4028234663852886e+38",
                              "Ceiling of the scale; the default, float32's largest value, is GradScaler's "
                              "behaviour (no ceiling beyond finiteness).")
        .min(0.0, true)
        .max(kFloatMax),
    ampkit::OptionSpec::Choice("on_min_scale", "error", "error|clamp",
                               "When an overflow asks for a backoff while the scale is already min_scale: "
                               "error stops the run (loss probably exploding, as DeepSpeed and fairseq), "
                               "clamp keeps skipping steps at min_scale (Megatron)."))
