// Test helper: SGD that records the gradients the optimizer is handed, i.e. what unscaling and
// clipping produced, as copies on the host.
#pragma once

#include <torch/optim/sgd.h>

#include <vector>

namespace ampkit::test {

class RecordingSGD : public torch::optim::SGD {
 public:
  using SGD::SGD;
  std::vector<at::Tensor> seen;
  at::Tensor step(LossClosure closure = nullptr) override {
    seen.clear();
    for (auto& group : param_groups())
      for (auto& p : group.params())
        seen.push_back(p.grad().defined() ? p.grad().cpu().clone() : at::Tensor());
    return SGD::step(closure);
  }
};

}  // namespace ampkit::test
