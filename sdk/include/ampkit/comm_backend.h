// Interface of communication backend plugins: the collectives data-parallel training needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/strategy.h>

#include <string>
#include <vector>

namespace ampkit {

// Where this process sits in the job; filled by the host from torchrun/SLURM/Open MPI
// environment variables, the config file and the command line.
struct DistributedConfig {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_seconds = 300.0;
};

// All collectives are blocking and in place. A backend for world_size 1 must still implement
// them (as no-ops) so the engine has one code path.
class AMPKIT_INTERFACE CommBackend : public Strategy {
 public:
  virtual void init(const DistributedConfig& config) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sum across ranks, then divide by world_size.
  virtual void all_reduce_mean(std::vector<at::Tensor>& tensors) = 0;
  virtual void broadcast(std::vector<at::Tensor>& tensors, int root) = 0;
  virtual void barrier() = 0;
};
}  // namespace ampkit
