// A minimal valid scaler shared by the broken test plugins, so each file shows only its defect.
#pragma once

#include <ampkit/scaler_plugin.h>

namespace broken {

class ConstantScaler final : public ampkit::LossScaler {
 public:
  explicit ConstantScaler(const ampkit::OptionValues&) {}
  double scale() const override { return 1.0; }
  void update(const ampkit::StepStats&) override {}
};

}  // namespace broken
