// A scaler that answers a scale the host cannot train with (0, NaN, inf, -8, or 1e30 beyond the
// bounds its dynamic device rule declares), or 512, which its device rule never gives, once
// `from_step` updates have run; before that 1024.
// It declares a device rule, so the deferred step runs with it. The host must refuse the answer as
// this plugin's fault, naming it, the call and the value (guarded_strategies.h), never train on it.
#include <ampkit/device_rules.h>
#include <ampkit/scaler_plugin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace {

double wrong_value(const std::string& answer) {
  if (answer == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (answer == "inf") return std::numeric_limits<double>::infinity();
  if (answer == "-8") return -8.0;
  if (answer == "1e30") return 1e30;
  if (answer == "512") return 512.0;
  return 0.0;
}

class WrongScaler final : public ampkit::LossScaler {
 public:
  explicit WrongScaler(const ampkit::OptionValues& options)
      : wrong_(wrong_value(options.get_string("answer"))), from_step_(options.get_int("from_step")) {
    if (options.get_string("rule") == "dynamic") {  // bounds [1, 65536] that never move the scale
      rule_.kind = ampkit::ScalerDeviceRule::Kind::dynamic;
      rule_.growth_interval = std::numeric_limits<int32_t>::max();
      rule_.hysteresis = std::numeric_limits<int32_t>::max();
      rule_.max_scale = 65536.0f;
    }
  }
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kScalerDeviceRule, &rule_);
  }
  double scale() const override { return updates_ >= from_step_ ? wrong_ : 1024.0; }
  void update(const ampkit::StepStats&) override { ++updates_; }
  ampkit::State save() const override {
    ampkit::State s;
    s.set("scale", 1024.0);
    s.set("growth_tracker", int64_t{0});
    s.set("hysteresis_tracker", int64_t{std::numeric_limits<int32_t>::max()});
    return s;
  }

 private:
  double wrong_;
  int64_t from_step_;
  int64_t updates_ = 0;
  ampkit::ScalerDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(scaler, wrong_scale, WrongScaler, "Test scaler that answers a scale no host can use",
              ampkit::OptionSpec::Choice("answer", "0", "0|nan|inf|-8|1e30|512", "The wrong scale."),
              ampkit::OptionSpec::Int("from_step", "2", "Updates after which scale() answers it.").min(0),
              ampkit::OptionSpec::Choice("rule", "constant", "constant|dynamic",
                                         "The device rule declared (dynamic: bounds [1, 65536])."))
