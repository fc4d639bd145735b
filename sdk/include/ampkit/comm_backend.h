// Interface of communication backend plugins: the collectives data-parallel training needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/layout.h>
#include <ampkit/strategy.h>

#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace ampkit {

// Where this process sits in the job and how gradients are synchronised; filled by the host from
// torchrun/SLURM/Open MPI environment variables, the config file and the command line
// (docs/distributed-training.md). The defaults are one process and torch DDP's defaults.
struct DistributedConfig {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  std::string backend = "local";  // the comm plugin's name
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::vector<int> device_ids;  // CUDA device of this rank; empty: local_rank
  std::string store = "tcp";    // "tcp" (TCPStore at master_addr:master_port) | "file:PATH"
  double bucket_cap_mb = 25.0;  // gradient bucket size for the all-reduce
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // rank 0's module buffers are sent to all ranks every step
  bool gradient_as_bucket_view = false;
  double timeout_seconds = 300.0;  // rendezvous and every collective
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
  // The c10d process group the engine builds torch's DDP Reducer on (bucketed all-reduce
  // overlapped with backward); owned by the backend. nullptr: no process group (one process),
  // the engine then averages with all_reduce_mean after backward.
  virtual c10d::ProcessGroup* process_group() { return nullptr; }
  // After a collective failed with `what`: a one-line explanation naming the lost or hung rank
  // where the backend can tell (heartbeats in the rendezvous store); `what` otherwise.
  virtual std::string explain_failure(const std::string& what) { return what; }
};
// AMPKIT_PLUGIN(comm, ...) implements this interface.
using Kind_comm = CommBackend;

namespace detail {
template <>
struct KindLayout<CommBackend> {
  static constexpr void add(LayoutText& t) {
    using D = DistributedConfig;
    t.type("DistributedConfig", sizeof(D),
           {offsetof(D, world_size), offsetof(D, rank), offsetof(D, local_rank), offsetof(D, backend),
            offsetof(D, master_addr), offsetof(D, master_port), offsetof(D, nnodes), offsetof(D, node_rank),
            offsetof(D, nproc_per_node), offsetof(D, device_ids), offsetof(D, store), offsetof(D, bucket_cap_mb),
            offsetof(D, find_unused_parameters), offsetof(D, broadcast_buffers),
            offsetof(D, gradient_as_bucket_view), offsetof(D, timeout_seconds)});
    t.type("Tensor", sizeof(at::Tensor), {});
  }
};
}  // namespace detail

}  // namespace ampkit
