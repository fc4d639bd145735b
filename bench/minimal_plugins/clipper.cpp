// A minimal plugin for bench/plugin_compile_time.sh: what compiling one costs.
#include <ampkit/clipper_plugin.h>
namespace {
class Fixed final : public ampkit::GradClipper {
 public:
  explicit Fixed(const ampkit::OptionValues& o) : max_(o.get_float("max_norm")) {}
  ampkit::ClipResult clip(const ampkit::StepStats& s) override {
    return {s.grad_norm > max_ ? max_ / s.grad_norm : 1.0, max_};
  }

 private:
  double max_;
};
}  // namespace
AMPKIT_PLUGIN(clipper, fixed, Fixed, "Clips the total norm at a fixed value",
              ampkit::OptionSpec::Float("max_norm", "1", "The largest total norm.").min(0, true));
