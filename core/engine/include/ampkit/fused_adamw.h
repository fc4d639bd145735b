// AdamW whose update is one fused pass over each parameter (at::_fused_adamw_, the kernel behind
// python's torch.optim.AdamW(fused=True), on CPU and CUDA) instead of the nine elementwise
// passes of torch::optim::AdamW::step. Same options, same per-parameter state objects, same
// save/load: checkpoints written with torch::optim::AdamW load into it and the other way round.
#pragma once

#include <ampkit/unscaling_optimizer.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace ampkit {

class FusedAdamW : public torch::optim::AdamW, public UnscalingOptimizer {
 public:
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}

  // As torch::optim::AdamW::step (state created on a parameter's first step, step counts
  // incremented before the update), then one _fused_adamw_ call per parameter group,
  // device and dtype.
  at::Tensor step(LossClosure closure = nullptr) override;

  // The same step with every gradient divided by `grad_scale` in the kernel's own pass (its
  // grad_scale argument, as torch.amp.GradScaler passes it to torch.optim.AdamW(fused=True)), the
  // quotient stored back into .grad.
  void step_unscaling(double grad_scale) override;
  // The deferred step: the kernel's grad_scale and found_inf arguments, as torch.amp.GradScaler
  // passes them to torch.optim.AdamW(fused=True); the device step counts subtract found_inf.
  void step_deferred(const at::Tensor& grad_scale, const at::Tensor& found_inf) override;
  void count_deferred_step(bool taken) override;

 private:
  // `found_inf`: the deferred step's (the step counts stay on the device until counted).
  at::Tensor run_step(const LossClosure& closure, std::optional<double> grad_scale,
                      const at::Tensor& grad_scale_tensor = {}, const at::Tensor& found_inf = {});

  // Each parameter's step count as the float tensor on its device that the kernel reads, kept
  // between steps and advanced by one _foreach_add_ per call (as python's fused AdamW keeps
  // state_steps), not made anew per parameter and step. `count` is the value it holds; a state
  // whose count differs (a loaded checkpoint) gets a fresh tensor.
  struct DeviceStep {
    at::Tensor tensor;
    int64_t count = 0;
  };
  at::Tensor device_step(const at::Tensor& param, int64_t count);
  std::unordered_map<const c10::TensorImpl*, DeviceStep> device_steps_;
  // Deferred steps run whose outcome has not reached the host: their parameters, in order.
  std::deque<std::vector<at::Tensor>> uncounted_;
  // The kernel's grad_scale per device: made once, filled each step (a fill, no allocation).
  at::Tensor& grad_scale_on(const at::Device& device);
  std::map<std::string, at::Tensor> grad_scales_;
};

}  // namespace ampkit
