// The workloads of --workload, each registered once: name, summary, options and factory.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "config/workload_options.h"

namespace ampkit::train {

class Workload;

// What the configuration reads (config/workload_options.h), and the factory it never sees.
struct WorkloadInfo : WorkloadOptions {
  std::unique_ptr<Workload> (*make)(const TrainConfig& cfg, const at::Device& device) = nullptr;
};

// In --help order; --workload's choices and help come from here.
const std::vector<WorkloadInfo>& workload_registry();
// The workload cfg.workload names (the option table has checked the name).
std::unique_ptr<Workload> make_workload(const TrainConfig& cfg, const at::Device& device);

// Each workload's options (hosts/train/src/workloads/<name>.cpp).
std::vector<HostOption> fashion_mnist_options();
std::vector<HostOption> char_gpt_options();
void check_char_gpt_options(const TrainConfig& cfg);
std::vector<HostOption> synthetic_options();
std::vector<HostOption> torchscript_options();

}  // namespace ampkit::train
