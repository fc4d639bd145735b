// Scaler "static": one constant loss scale for the whole run (Apex/DeepSpeed static_loss_scale).
#include <ampkit/device_rules.h>
#include <ampkit/scaler_plugin.h>

#include <cmath>
#include <stdexcept>

namespace {

class StaticLossScaler final : public ampkit::LossScaler {
 public:
  explicit StaticLossScaler(const ampkit::OptionValues& options) : scale_(options.get_float("scale")) {}
  double scale() const override { return scale_; }
  // Overflowing steps are skipped by the NaN policy; a static scale never adapts.
  void update(const ampkit::StepStats&) override {}
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kScalerDeviceRule, &rule_);  // constant
  }
  ampkit::State save() const override {
    ampkit::State s;
    s.set("scale", scale_);
    return s;
  }
  void load(const ampkit::State& state) override {
    const double saved = state.get<double>("scale");
    if (saved != scale_)
      throw std::runtime_error(
          "scaler 'static': checkpoint was written with scaler.scale=" + ampkit::format_number(saved) +
          " but this run uses " + ampkit::format_number(scale_));
  }

 private:
  double scale_;
  ampkit::ScalerDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(scaler, static, StaticLossScaler,
              "Constant loss scale; steps whose gradients overflow are skipped",
              ampkit::OptionSpec::Float("scale", "1024",
                                        "Constant the loss is multiplied by before backward; "
                                        "use the largest power of two that does not overflow.")
                  .min(0.0, true)
                  .max(3.0e38))
