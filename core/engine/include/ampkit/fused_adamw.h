// AdamW whose update is one fused pass over each parameter (at::_fused_adamw_, the kernel behind
// python's torch.optim.AdamW(fused=True), on CPU and CUDA) instead of the nine elementwise
// passes of torch::optim::AdamW::step. Same options, same per-parameter state objects, same
// save/load: checkpoints written with torch::optim::AdamW load into it and the other way round.
#pragma once

#include <torch/optim/adamw.h>

#include <vector>

namespace ampkit {

class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}

  // As torch::optim::AdamW::step (state created on a parameter's first step, step counts
  // incremented before the update), then one _fused_adamw_ call per parameter group,
  // device and dtype.
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace ampkit
