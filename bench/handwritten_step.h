// The hand-written LibTorch training step ampkit is measured against (docs/benchmarks.md): autocast,
// scaled backward, GradScaler's unscale + inf check and scale update, clip_grad_norm_ at 1.0, AdamW —
// written the way a LibTorch user would, no framework. fp16 uses a dynamic scale from 65536 with
// GradScaler's defaults. Used by ampkit-bench-handwritten (a whole run) and ampkit-bench-overhead
// (alternating with ampkit's step in one process).
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/fused_adamw.h"
#include "config/train_config.h"
#include "workloads/workload.h"

namespace ampkit::bench {

// The value of a benchmark's own count option (--warmup, --pairs): a whole number >= 0, or a
// usage error naming the option.
inline int64_t count_option(const char* flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 0)
    throw Error(ErrorCategory::usage, std::string(flag) + " takes a whole number >= 0, got '" + text + "'");
  return v;
}

// CPU autocast for the step's forward, as torch.autocast does it (cache cleared on exit).
struct Autocast {
  explicit Autocast(Precision p) : on(p != Precision::fp32) {
    if (!on) return;
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, p == Precision::bf16 ? at::kBFloat16 : at::kHalf);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  bool on;
};

class HandWrittenStep {
 public:
  // `fused`: ampkit's FusedAdamW (the same optimizer as ampkit's side) instead of torch::optim::AdamW.
  HandWrittenStep(std::vector<at::Tensor> params, const TrainConfig& cfg, bool fused)
      : cfg_(cfg), params_(std::move(params)), fp16_(cfg.precision == Precision::fp16) {
    const auto options = torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay);
    if (fused)
      optimizer_ = std::make_unique<FusedAdamW>(params_, options);
    else
      optimizer_ = std::make_unique<torch::optim::AdamW>(params_, options);
    scale_ = at::full({1}, fp16_ ? 65536.0 : 1.0, at::kFloat);
    growth_tracker_ = at::zeros({1}, at::kInt);
    found_inf_ = at::zeros({1}, at::kFloat);
  }

  // One optimizer step over cfg.accumulate micro-batches from `first_batch`; false when fp16
  // gradients overflowed and the step was skipped.
  bool step(train::Workload& workload, int64_t first_batch) {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
    for (int micro = 0; micro < cfg_.accumulate; ++micro) {
      at::Tensor loss;
      {
        Autocast autocast(cfg_.precision);
        loss = workload.loss(first_batch + micro);
      }
      (loss.to(at::kFloat) * (scale_ / static_cast<double>(cfg_.accumulate))).backward();
    }
    bool stepped = true;
    if (fp16_) {
      std::vector<at::Tensor> grads;
      for (auto& p : params_)
        if (p.grad().defined()) grads.push_back(p.grad());
      found_inf_.zero_();
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
      stepped = found_inf_.item<float>() == 0.0f;
    }
    torch::nn::utils::clip_grad_norm_(params_, 1.0);
    if (stepped) optimizer_->step();
    if (fp16_) at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, 2.0, 0.5, 2000);
    return stepped;
  }

  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  const TrainConfig& cfg_;
  std::vector<at::Tensor> params_;
  bool fp16_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  at::Tensor scale_, growth_tracker_, found_inf_;
};

}  // namespace ampkit::bench
