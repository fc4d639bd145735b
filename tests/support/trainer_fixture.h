// Test fixture: a Trainer over a one-layer model with SGD and built-in strategies, the setup the
// engine tests share.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ampkit/strategy_set.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"

namespace ampkit::test {

// Linear(8 -> 4): two parameters, initialised from LibTorch's default generator.
struct TinyModel {
  torch::nn::Linear layer{torch::nn::LinearOptions(8, 4)};
  std::vector<at::Tensor> params() { return {layer->weight, layer->bias}; }
  std::vector<std::string> names() { return {"weight", "bias"}; }
  // The tests' loss: the mean square of the output.
  at::Tensor loss(const at::Tensor& x) { return layer->forward(x).pow(2).mean(); }
  // Starts from `other`'s weights, so that two runs can be compared step by step.
  void copy_weights_from(TinyModel& other) {
    torch::NoGradGuard g;
    layer->weight.copy_(other.layer->weight);
    layer->bias.copy_(other.layer->bias);
  }
};

// Batch i: 16 x 8 normal values, the same for the same i in every run.
inline at::Tensor batch_x(int64_t i) {
  at::manual_seed(100 + i);
  return at::randn({16, 8});
}

// A constant learning rate (the schedule most tests need).
inline LrSchedule constant_lr(double lr) {
  LrSchedule s;
  s.base_lr = lr;
  return s;
}

// The strategies (by name, kinds left out get their defaults), the model, SGD at the schedule's
// base_lr and the Trainer over them, built in that order.
struct TinyTrainer {
  std::unique_ptr<StrategySet> strategies;
  TinyModel model;
  torch::optim::SGD optimizer;
  Trainer trainer;

  explicit TinyTrainer(BuiltinPlugins& plugins, const std::map<std::string, StrategyChoice>& choices = {},
                       const LrSchedule& schedule = constant_lr(0.1), Precision precision = Precision::fp32,
                       int accumulation_steps = 1)
      : strategies(plugins.strategies(choices)),
        optimizer(model.params(), torch::optim::SGDOptions(schedule.base_lr)),
        trainer(precision, accumulation_steps, model.params(), model.names(), optimizer,
                BuiltinPlugins::of(*strategies), schedule) {}
};

}  // namespace ampkit::test
