// Interface of communication backend plugins: the collectives data-parallel training needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/layout.h>
#include <ampkit/strategy.h>

#include <cstdint>
#include <cstring>
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

// What explain_failure() found after a collective failed: a typed reason the host decides on (a
// lost rank is a distributed error, exit 7), the lost ranks where the backend can tell, and one
// line for the user. Never parsed: the message is for people, the reason for programs.
struct CommFailure {
  enum class Reason : int32_t {
    unknown = 0,        // the backend cannot tell more than the collective's own message
    lost_rank = 1,      // lost_ranks stopped answering (killed, crashed, hung, or the store's host gone)
    store_stopped = 2,  // the rendezvous store stopped answering and no rank can be named
    ranks_alive = 3,    // every rank still answers: one is stuck in its own work, or they disagree
  };
  Reason reason = Reason::unknown;
  std::vector<int> lost_ranks;
  std::string message;
};

// What a comm plugin declares about itself, so the host checks a job without knowing plugin
// names: the bits returned by the optional function kCommFactsFunction (see find_function).
enum CommFact : uint32_t {
  kCommMultiProcess = 1u << 0,  // runs more than one process (a world size above 1)
  kCommNeedsCuda = 1u << 1,     // needs a visible CUDA device
  kCommStateEmpty = 1u << 2,    // save() returns nothing: its checkpoint state binds no resume to it
};
// The optional function "ampkit_comm_facts": `uint32_t facts(void)`, the CommFact bits.
inline constexpr const char* kCommFactsFunction = "ampkit_comm_facts";
using CommFactsFunction = uint32_t (*)();

// The bits of CommFact, read through the optional lookup; a plugin that offers no facts is taken
// to run any world size, to need no CUDA and to keep state (nothing refused, nothing assumed).
struct CommFacts {
  bool multi_process = true;
  bool needs_cuda = false;
  bool state_empty = false;
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
  // Every rank's `tensor`, in rank order: shape [world_size, *tensor.sizes()], on tensor's device
  // and of its dtype (ABI 5). Every rank passes the same shape and dtype. Without a process group
  // the engine sends each step's small values (loss, stop signal, the host's values) in one
  // all_gather; with one, they ride in the Reducer's gradient buckets and need no collective.
  virtual at::Tensor all_gather(const at::Tensor& tensor) = 0;
  virtual void barrier() = 0;
  // The c10d process group the engine builds torch's DDP Reducer on (bucketed all-reduce
  // overlapped with backward). nullptr: no process group (one process); the engine then averages
  // with all_reduce_mean after backward. The rule that makes a raw pointer safe here: the backend
  // holds the group in a c10::intrusive_ptr from init() until it is destroyed, and returns that
  // group's get(). The engine takes its own reference once (unsafe_reclaim_from_nonowning, which
  // increments the count), so the group outlives the backend's pointer if the Reducer needs it.
  virtual c10d::ProcessGroup* process_group() { return nullptr; }
  // After a collective failed with `what`: why, typed, naming the lost or hung rank where the
  // backend can tell (heartbeats in the rendezvous store); reason unknown with `what` otherwise.
  virtual CommFailure explain_failure(const std::string& what) {
    return {CommFailure::Reason::unknown, {}, what};
  }
};
// AMPKIT_PLUGIN(comm, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using comm = CommBackend;
}

// The plugin's facts (CommFact), or the defaults of CommFacts when it offers none.
inline CommFacts comm_facts(Strategy& comm) {
  CommFacts facts;
  if (void* f = comm.find_function(kCommFactsFunction)) {
    const uint32_t bits = reinterpret_cast<CommFactsFunction>(f)();
    facts.multi_process = (bits & kCommMultiProcess) != 0;
    facts.needs_cuda = (bits & kCommNeedsCuda) != 0;
    facts.state_empty = (bits & kCommStateEmpty) != 0;
  }
  return facts;
}

// What a comm plugin's find_function returns for kCommFactsFunction, `Bits` being its CommFact bits:
//   void* find_function(const char* name) override { return
//   ampkit::offer_comm_facts<kCommMultiProcess>(name); }
template <uint32_t Bits>
void* offer_comm_facts(const char* name) {
  if (name == nullptr || std::strcmp(name, kCommFactsFunction) != 0) return nullptr;
  CommFactsFunction f = [] { return Bits; };
  return reinterpret_cast<void*>(f);
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
    using F = CommFailure;
    t.type("CommFailure", sizeof(F), {offsetof(F, reason), offsetof(F, lost_ranks), offsetof(F, message)});
  }
};
}  // namespace detail

}  // namespace ampkit
