// Clipper "value": clip_grad_value_ semantics, an element-wise clamp of the unscaled gradients.
#include <ATen/Functions.h>
#include <ampkit/clipper_plugin.h>

#include <cmath>
#include <vector>

namespace {

class ValueGradClipper final : public ampkit::GradClipper {
 public:
  explicit ValueGradClipper(const ampkit::OptionValues& options)
      : clip_value_(options.get_float("clip_value")) {}

  // No global coefficient: the rule is per element. The statistics tell whether this step has
  // anything to clamp at all, which saves the extra pass on the (usual) steps that do not.
  ampkit::ClipResult clip(const ampkit::StepStats& stats) override {
    grad_norm_ = stats.grad_norm;
    grad_max_abs_ = stats.grad_max_abs;
    return {1.0, clip_value_};
  }

  bool clips_elementwise() const override { return true; }

  double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& grads) override {
    // grad_max_abs is exact in double, the unscaled fp32 values are within one rounding (6e-8
    // relative) of it: below this margin no element can exceed clip_value, so skipping the clamp
    // is bit-identical to doing it.
    if (grad_max_abs_ <= clip_value_ * (1.0 - 1e-6)) return 1.0;
    std::vector<at::Tensor> defined;
    for (const auto& g : grads)
      if (g.defined() && g.numel() > 0) defined.push_back(g);
    if (defined.empty()) return 1.0;
    // Same op as clip_grad_value_ (clamp_ with a double bound), hence bit-identical results.
    for (auto& g : defined) g.clamp_(-clip_value_, clip_value_);
    if (!(grad_max_abs_ > clip_value_)) return 1.0;  // inside the margin and nothing was above
    // The clipped norm is only for the metrics; one read pass, on clipping steps only.
    const std::vector<at::Tensor> norms = at::_foreach_norm(defined, 2);
    const double after = at::stack(norms).to(at::kDouble).pow(2).sum().sqrt().item<double>();
    const double ratio = grad_norm_ > 0 ? after / grad_norm_ : 1.0;
    // Something was clamped, so the metric must read "clipped" (< 1) even where the fp32 norm
    // rounds to the unclipped one.
    return ratio < 1.0 ? ratio : std::nextafter(1.0, 0.0);
  }

 private:
  double clip_value_;
  double grad_norm_ = 0.0;
  double grad_max_abs_ = 0.0;
};

}  // namespace

AMPKIT_PLUGIN(clipper, value, ValueGradClipper,
              "Clamp every unscaled gradient element to [-clip_value, clip_value] (clip_grad_value_)",
              // Per precision as norm's max_norm (1 : 5 : 10): the measured healthy largest element is
              // 0.25-1.7 at every precision (docs/gradient-clipping.md, "Defaults per precision").
              ampkit::OptionSpec::Float("clip_value", "fp16=1;bf16=5;fp32=10",
                                        "Largest allowed absolute value of an unscaled gradient "
                                        "element; larger ones are set to +-clip_value.")
                  .per_precision()
                  .min(0.0, true))
