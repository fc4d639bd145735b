// Scaler "none": the loss is not scaled (fp32 and bf16 training need no scaling).
#include <ampkit/device_rules.h>
#include <ampkit/scaler_plugin.h>

namespace {

class NoLossScaler final : public ampkit::LossScaler {
 public:
  explicit NoLossScaler(const ampkit::OptionValues&) {}
  double scale() const override { return 1.0; }
  void update(const ampkit::StepStats&) override {}
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kScalerDeviceRule, &rule_);  // constant 1
  }

 private:
  ampkit::ScalerDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(scaler, none, NoLossScaler, "No loss scaling (scale 1); right for fp32 and bf16")
