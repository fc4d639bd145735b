// An optimizer that unscales the gradients inside its own pass, so that the Trainer folds unscale
// and clip into its step instead of multiplying the gradients first.
#pragma once

#include <ATen/core/Tensor.h>

namespace ampkit {

// The C++ side of torch.optim's `_step_supports_amp_scaling` (the fused Adam, AdamW and SGD, to which
// torch.amp.GradScaler hands `grad_scale`): the step divides every gradient by `grad_scale` inside
// its own pass over the parameter and stores the quotient back into .grad. A Trainer that would
// otherwise multiply the gradients by clip_coefficient / scale (docs/architecture.md, "One optimizer
// step", 6) hands scale / clip_coefficient to it instead: the multiply pass disappears, and .grad
// after the step holds the same unscaled, clipped values. An optimizer declares it by also
// deriving from this class (FusedAdamW does); the Trainer finds it with dynamic_cast.
class UnscalingOptimizer {
 public:
  virtual ~UnscalingOptimizer() = default;

  // One step on the gradients divided by `grad_scale` (finite, > 0; read as float32, as
  // GradScaler's scale is). Skipping non-finite steps is the caller's business: it runs no step then.
  virtual void step_unscaling(double grad_scale) = 0;

  // The deferred step (deferred_step.h): the same step with `grad_scale` and `found_inf` as 0-dim
  // float32 tensors on the parameters' device, read by the kernel there (no host read): where
  // found_inf is 1 nothing changes, as torch's fused optimizers skip; each parameter's step count
  // on the device advances by 1 - found_inf. The host's own counts (the optimizer state that
  // checkpoints save) follow when the step's outcome reaches the host: count_deferred_step(taken),
  // once per step_deferred, in order.
  virtual void step_deferred(const at::Tensor& grad_scale, const at::Tensor& found_inf) = 0;
  virtual void count_deferred_step(bool taken) = 0;
};

}  // namespace ampkit
