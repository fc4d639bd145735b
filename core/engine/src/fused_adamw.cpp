// AdamW in one fused pass per parameter (docs/benchmarks.md: 100M parameters).
#include "ampkit/fused_adamw.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "ampkit/error.h"

namespace ampkit {

at::Tensor FusedAdamW::step(LossClosure closure) {
  return run_step(closure, std::nullopt);
}

void FusedAdamW::step_unscaling(double grad_scale) {
  run_step(nullptr, grad_scale);
}

void FusedAdamW::step_deferred(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  run_step(nullptr, std::nullopt, grad_scale, found_inf);
}

void FusedAdamW::count_deferred_step(bool taken) {
  if (uncounted_.empty()) throw Error(ErrorCategory::internal, "FusedAdamW: a deferred step counted twice");
  const std::vector<at::Tensor> params = std::move(uncounted_.front());
  uncounted_.pop_front();
  if (!taken) return;
  for (const auto& p : params) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*state_.at(p.unsafeGetTensorImpl()));
    state.step(state.step() + 1);
    device_steps_[p.unsafeGetTensorImpl()].count = state.step();
  }
}

at::Tensor FusedAdamW::device_step(const at::Tensor& param, int64_t count) {
  DeviceStep& d = device_steps_[param.unsafeGetTensorImpl()];
  if (!d.tensor.defined() || d.count != count || d.tensor.device() != param.device())
    d.tensor = at::scalar_tensor(static_cast<double>(count),
                                 at::TensorOptions().dtype(at::kFloat).device(param.device()));
  d.count = count + 1;  // after this step's _foreach_add_
  return d.tensor;
}

at::Tensor& FusedAdamW::grad_scale_on(const at::Device& device) {
  at::Tensor& t = grad_scales_[device.str()];
  if (!t.defined()) t = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(device));
  return t;
}

at::Tensor FusedAdamW::run_step(const LossClosure& closure, std::optional<double> grad_scale,
                                const at::Tensor& grad_scale_tensor, const at::Tensor& found_inf) {
  const bool deferred = found_inf.defined();
  std::vector<at::Tensor> stepped;  // the deferred step's parameters, counted later
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The CUDA kernel takes tensors of one device and dtype per call; python's fused AdamW groups
    // them the same way (Optimizer._group_tensors_by_device_and_dtype).
    struct Batch {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    };
    std::map<std::pair<std::string, at::ScalarType>, Batch> batches;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      at::Tensor step;
      if (deferred) {  // the device's count is ahead of the host's by the steps not yet counted
        DeviceStep& d = device_steps_[p.unsafeGetTensorImpl()];
        if (!d.tensor.defined() || d.tensor.device() != p.device() ||
            (uncounted_.empty() && d.count != state.step()))
          d = {at::scalar_tensor(static_cast<double>(state.step()),
                                 at::TensorOptions().dtype(at::kFloat).device(p.device())),
               state.step()};
        step = d.tensor;
        stepped.push_back(p);
      } else {
        step = device_step(p, state.step());
        state.step(state.step() + 1);
      }
      Batch& b = batches[{p.device().str(), p.scalar_type()}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(state.exp_avg());
      b.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) b.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      b.steps.push_back(step);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, b] : batches) {
      // The kernel reads the step after its increment, as python's fused AdamW runs it.
      at::_foreach_add_(b.steps, at::Scalar(1.0));
      // The kernel reads grad_scale as a float on the parameters' device (GradScaler's scale tensor).
      std::optional<at::Tensor> scale;
      if (grad_scale) scale = grad_scale_on(b.params.front().device()).fill_(*grad_scale);
      if (deferred) scale = grad_scale_tensor;
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                        options.lr(), beta1, beta2, options.weight_decay(), options.eps(), options.amsgrad(),
                        /*maximize=*/false, scale,
                        deferred ? std::optional<at::Tensor>(found_inf) : std::nullopt);
      // A skipped step leaves the counts where they were (torch's fused optimizers do the same).
      if (deferred) at::_foreach_sub_(b.steps, std::vector<at::Tensor>(b.steps.size(), found_inf));
    }
  }
  if (deferred) uncounted_.push_back(std::move(stepped));
  return loss;
}

}  // namespace ampkit
