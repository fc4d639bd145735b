// A TinyModel under FusedAdamW with built-in strategies, made twice from the same weights, so that a
// test can run the Trainer's synchronous and deferred (or fallen-back) steps side by side.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ampkit/fused_adamw.h"
#include "ampkit/trainer.h"
#include "trainer_fixture.h"

namespace ampkit::test {

struct FusedRun {
  std::unique_ptr<StrategySet> strategies;
  TinyModel model;
  FusedAdamW optimizer;
  Trainer trainer;
  FusedRun(BuiltinPlugins& plugins, const std::map<std::string, StrategyChoice>& choices, TinyModel& from)
      : strategies(plugins.strategies(choices)),
        optimizer(model.params(), torch::optim::AdamWOptions(1e-2)),
        trainer(Precision::fp16, 1, model.params(), model.names(), optimizer, BuiltinPlugins::of(*strategies),
                constant_lr(1e-2)) {
    model.copy_weights_from(from);
  }
};

}  // namespace ampkit::test
