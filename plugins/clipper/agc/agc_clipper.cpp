// Clipper "agc": unit-wise adaptive gradient clipping (NFNets, Brock et al. 2021), timm's semantics.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ampkit/clipper_plugin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace {

// timm.utils.agc.unitwise_norm: one norm per output unit (dim 0 of Linear/Conv weights, kept as a
// broadcastable shape); the whole tensor for biases, gains and scalars.
at::Tensor unitwise_norm(const at::Tensor& x) {
  if (x.dim() <= 1) return at::linalg_vector_norm(x, 2);
  std::vector<int64_t> dims(static_cast<size_t>(x.dim() - 1));
  std::iota(dims.begin(), dims.end(), 1);
  return at::linalg_vector_norm(x, 2, dims, /*keepdim=*/true);
}

class AgcGradClipper final : public ampkit::GradClipper {
 public:
  explicit AgcGradClipper(const ampkit::OptionValues& options)
      : clip_factor_(options.get_float("clip_factor")),
        eps_(options.get_float("eps")),
        skip_last_(options.get_int("skip_last")) {}

  // The threshold is relative to each unit's weights, so there is no global coefficient.
  ampkit::ClipResult clip(const ampkit::StepStats&) override { return {1.0, clip_factor_}; }

  bool clips_elementwise() const override { return true; }

  double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& grads) override {
    const int64_t count = static_cast<int64_t>(std::min(parameters.size(), grads.size()));
    const int64_t clipped_count = std::max<int64_t>(0, count - skip_last_);
    // Squared norms before/after and the number of clipped units, kept on the gradients' device
    // and read once at the end: one synchronisation per step, not one per tensor.
    std::vector<at::Tensor> before, after, units;
    for (int64_t i = 0; i < count; ++i) {
      const at::Tensor& g = grads[static_cast<size_t>(i)];
      if (!g.defined() || g.numel() == 0) continue;
      const at::Tensor grad_norm = unitwise_norm(g);
      before.push_back(grad_norm.to(at::kDouble).pow(2).sum());
      if (i >= clipped_count) {  // skip_last: left as they are (the classifier, as the paper advises)
        after.push_back(before.back());
        continue;
      }
      const at::Tensor& p = parameters[static_cast<size_t>(i)];
      // timm: max_norm = unitwise_norm(p).clamp_(min=eps).mul_(clip_factor), in the weights' dtype.
      const at::Tensor max_norm = unitwise_norm(p).to(g.scalar_type()).clamp_min_(eps_).mul_(clip_factor_);
      // timm: where(grad_norm < max_norm, g, g * (max_norm / grad_norm.clamp(min=1e-6))). As one
      // in-place multiply by a per-unit factor: kept units get exactly 1, so the bits are the same.
      const at::Tensor factor =
          at::where(grad_norm < max_norm, at::ones_like(grad_norm), max_norm / grad_norm.clamp_min(1e-6));
      g.mul_(factor);
      const at::Tensor new_norm = grad_norm * factor;
      after.push_back(new_norm.to(at::kDouble).pow(2).sum());
      units.push_back(at::lt(new_norm, grad_norm).sum().to(at::kDouble));
    }
    if (before.empty() || units.empty()) return 1.0;
    const at::Tensor totals =
        at::stack({at::stack(before).sum(), at::stack(after).sum(), at::stack(units).sum()}).cpu();
    const double* t = totals.data_ptr<double>();
    if (t[2] == 0.0) return 1.0;  // no unit was clipped: the gradients are untouched
    const double ratio = t[0] > 0 ? std::sqrt(t[1] / t[0]) : 1.0;
    return ratio < 1.0 ? ratio : std::nextafter(1.0, 0.0);  // something was clipped: read "< 1"
  }

 private:
  double clip_factor_;
  double eps_;
  int64_t skip_last_;
};

}  // namespace

AMPKIT_PLUGIN(clipper, agc, AgcGradClipper,
              "Unit-wise adaptive gradient clipping relative to the weights' norms (NFNets AGC, timm)",
              // Per precision (docs/gradient-clipping.md, "Defaults per precision"): the paper's 0.01
              // for fp16, looser where a large relative update cannot overflow anything.
              ampkit::OptionSpec::Float("clip_factor", "fp16=0.01;bf16=0.05;fp32=0.1",
                                        "Largest allowed ratio of a unit's gradient norm to its "
                                        "weight norm (lambda; timm's and the paper's 0.01 suits "
                                        "large batches, raise it for small ones).")
                  .per_precision()
                  .min(0.0, true),
              ampkit::OptionSpec::Float("eps", "1e-3",
                                        "Floor of the weight norm, so units with zero-initialised "
                                        "weights can still move (timm's default).")
                  .min(0.0, true),
              ampkit::OptionSpec::Int("skip_last", "0",
                                      "Number of trailing parameters left unclipped; 2 skips a "
                                      "final Linear classifier (weight and bias), as the paper "
                                      "and timm's train.py do.")
                  .min(0.0))
