// The workloads' part of ampkit-train's option table, as the configuration sees it: each
// workload's name and summary (--workload's choices and help), its own options and the checks
// between them. The configuration never includes the workloads: the workload registry
// (workloads/registry.cpp), which sits above it, provides this list.
#pragma once

#include <string>
#include <vector>

#include "config/option_table.h"

namespace ampkit {

struct WorkloadOptions {
  std::string name;     // --workload NAME
  std::string summary;  // what it trains, for --workload's help
  // Its own options, declared beside its code; --help shows them as a group of their own.
  std::vector<HostOption> (*options)() = nullptr;
  // Rejects values of its options that disagree with each other (Error(usage), one line); null
  // when each option's own range is enough. Run for every workload, whichever is chosen.
  void (*check)(const TrainConfig& cfg) = nullptr;
};

// In --help order. Defined by the workload registry, in the same library.
const std::vector<WorkloadOptions>& workload_options();

}  // namespace ampkit
