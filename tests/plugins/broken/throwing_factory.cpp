// A plugin whose constructor throws: loading succeeds, creating the strategy must fail cleanly.
#include <ampkit/scaler_plugin.h>

#include <stdexcept>

namespace {

class ThrowingScaler final : public ampkit::LossScaler {
 public:
  explicit ThrowingScaler(const ampkit::OptionValues&) {
    throw std::runtime_error("throwing_factory refuses to start: no GPU budget left (test)");
  }
  double scale() const override { return 1.0; }
  void update(const ampkit::StepStats&) override {}
};

}  // namespace

AMPKIT_PLUGIN(scaler, throwing_factory, ThrowingScaler, "Test plugin whose factory throws")
