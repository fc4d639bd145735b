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

// Where this process sits in the job and how it meets the others: what a communication backend
// needs to rendezvous and nothing else (how gradients are bucketed is the engine's business:
// ampkit::DataParallelOptions). Filled by the host from torchrun/SLURM/Open MPI environment
// variables, the config file and the command line (docs/distributed-training.md).
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
  std::vector<int> device_ids;     // CUDA device of this rank; empty: local_rank
  std::string store = "tcp";       // "tcp" (TCPStore at master_addr:master_port) | "file:PATH"
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
  // overlapped with backward). nullptr: no process group (one process); the engine then averages
  // with all_reduce_mean after backward. The rule that makes a raw pointer safe here: the backend
  // holds the group in a c10::intrusive_ptr from init() until it is destroyed, and returns that
  // group's get(). The engine takes its own reference once (unsafe_reclaim_from_nonowning, which
  // increments the count), so the group outlives the backend's pointer if the Reducer needs it.
  virtual c10d::ProcessGroup* process_group() { return nullptr; }
  // After a collective failed with `what`: a one-line explanation naming the lost or hung rank
  // where the backend can tell (heartbeats in the rendezvous store); `what` otherwise.
  virtual std::string explain_failure(const std::string& what) { return what; }
};
// AMPKIT_PLUGIN(comm, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using comm = CommBackend;
}

namespace detail {
template <>
struct KindLayout<CommBackend> {
  static constexpr void add(LayoutText& t) {
    using D = DistributedConfig;
    t.type("DistributedConfig", sizeof(D),
           {offsetof(D, world_size), offsetof(D, rank), offsetof(D, local_rank), offsetof(D, backend),
            offsetof(D, master_addr), offsetof(D, master_port), offsetof(D, nnodes), offsetof(D, node_rank),
            offsetof(D, nproc_per_node), offsetof(D, device_ids), offsetof(D, store),
            offsetof(D, timeout_seconds)});
    t.type("Tensor", sizeof(at::Tensor), {});
  }
};
}  // namespace detail

}  // namespace ampkit
