// A minimal plugin for bench/plugin_compile_time.sh: what compiling one costs.
#include <ampkit/scaler_plugin.h>
namespace {
class Fixed final : public ampkit::LossScaler {
 public:
  explicit Fixed(const ampkit::OptionValues& o) : scale_(o.get_float("scale")) {}
  double scale() const override { return scale_; }
  void update(const ampkit::StepStats&) override {}

 private:
  double scale_;
};
}  // namespace
AMPKIT_PLUGIN(scaler, fixed, Fixed, "A fixed loss scale",
              ampkit::OptionSpec::Float("scale", "128", "The loss scale.").min(0, true));
