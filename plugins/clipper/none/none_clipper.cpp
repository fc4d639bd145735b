// Clipper "none": gradients are only unscaled, never clipped.
#include <ampkit/clipper_plugin.h>
#include <ampkit/device_rules.h>

namespace {

class NoGradClipper final : public ampkit::GradClipper {
 public:
  explicit NoGradClipper(const ampkit::OptionValues&) {}
  ampkit::ClipResult clip(const ampkit::StepStats&) override { return {1.0, 0.0}; }
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kClipperDeviceRule, &rule_);  // coefficient 1
  }

 private:
  ampkit::ClipperDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(clipper, none, NoGradClipper, "No clipping; gradients are only unscaled")
