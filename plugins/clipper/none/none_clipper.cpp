// Clipper "none": gradients are only unscaled, never clipped.
#include <ampkit/clipper_plugin.h>

namespace {

class NoGradClipper final : public ampkit::GradClipper {
 public:
  explicit NoGradClipper(const ampkit::OptionValues&) {}
  ampkit::ClipResult clip(const ampkit::StepStats&) override { return {1.0, 0.0}; }
};

}  // namespace

AMPKIT_PLUGIN(clipper, none, NoGradClipper, "No clipping; gradients are only unscaled")
