// The workload registry: --workload's choices, help and per-workload option groups come from here.
#include "workloads/registry.h"

#include "ampkit/error.h"
#include "workloads/workload.h"

namespace ampkit {

namespace train {

const std::vector<WorkloadInfo>& workload_registry() {
  static const std::vector<WorkloadInfo> registry = {
      {{"fashion-mnist", "CNN on Fashion-MNIST", fashion_mnist_options, nullptr}, make_fashion_mnist},
      {{"char-gpt", "character-level GPT on the fortunes corpus", char_gpt_options, check_char_gpt_options},
       make_char_gpt},
      {{"synthetic", "MLP on generated data", synthetic_options, nullptr}, make_synthetic},
      {{"torchscript", "your own TorchScript model (torch.jit.script(m).save) on torch.save'd tensors",
        torchscript_options, nullptr},
       make_torchscript},
  };
  return registry;
}

std::unique_ptr<Workload> make_workload(const TrainConfig& cfg, const at::Device& device) {
  for (const WorkloadInfo& w : workload_registry())
    if (w.name == cfg.workload) return w.make(cfg, device);
  throw Error(ErrorCategory::internal, "no workload '" + cfg.workload + "' in the registry");
}

}  // namespace train

// The configuration's view of the registry: the same entries without their factories.
const std::vector<WorkloadOptions>& workload_options() {
  static const std::vector<WorkloadOptions> declared(train::workload_registry().begin(),
                                                     train::workload_registry().end());
  return declared;
}

}  // namespace ampkit
