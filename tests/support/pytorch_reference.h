// Test helper: PyTorch's own unscale-then-clip sequence, which the engine's single pass is checked
// against.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>

#include <vector>

namespace ampkit::test {

// PyTorch's sequence: GradScaler.unscale_ (the fused non-finite check and unscale), then
// torch.nn.utils.clip_grad_norm_. Run on float64 copies: PyTorch's own fp32 CPU norm is off by
// ~1e-6 relative on 3e5 normal elements and by 1.5e-5 on heavy-tailed ones (measured against a
// float64 sum), so an fp32 reference could not tell a 1e-6 error of ours from its own.
inline double reference_unscale_and_clip(std::vector<at::Tensor>& grads, double scale, double max_norm,
                                         double norm_type) {
  for (auto& g : grads) g = g.to(at::kDouble);
  at::Tensor found_inf = at::zeros({1});
  at::Tensor inv_scale = at::full({1}, 1.0 / scale);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  std::vector<at::Tensor> params;
  for (auto& g : grads) {
    at::Tensor p = at::zeros_like(g).requires_grad_(true);
    p.mutable_grad() = g;
    params.push_back(p);
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
}

}  // namespace ampkit::test
