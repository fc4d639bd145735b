// What the gloo and nccl comm plugins share: rendezvous store, c10d process group, heartbeats.
#pragma once

#include <ampkit/comm_plugin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace ampkit::comm {

// A CommBackend on a c10d process group. Subclasses make the c10d Backend (Gloo, NCCL) and say
// which device type its tensors live on; rendezvous, collectives and failure diagnosis are here.
class C10dCommBackend : public CommBackend {
 public:
  explicit C10dCommBackend(const OptionValues& options);
  ~C10dCommBackend() override;

  void init(const DistributedConfig& config) override;
  int rank() const override { return config_.rank; }
  int world_size() const override { return config_.world_size; }
  void all_reduce_mean(std::vector<at::Tensor>& tensors) override;
  void broadcast(std::vector<at::Tensor>& tensors, int root) override;
  at::Tensor all_gather(const at::Tensor& tensor) override;
  void barrier() override;
  c10d::ProcessGroup* process_group() override { return group_.get(); }
  CommFailure explain_failure(const std::string& what) override;

 protected:
  virtual c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const DistributedConfig& config) = 0;
  virtual c10d::ProcessGroup::BackendType backend_type() const = 0;
  virtual std::vector<c10::DeviceType> device_types() const = 0;
  virtual std::string name() const = 0;
  std::chrono::milliseconds timeout() const;

 private:
  c10::intrusive_ptr<c10d::Store> make_store();
  void heartbeat_loop(c10::intrusive_ptr<c10d::Store> store);
  // Runs `collective` on tensors flattened per dtype (c10d wants one tensor per device).
  void flat_collective(std::vector<at::Tensor>& tensors,
                       const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& run);

  double heartbeat_seconds_;
  DistributedConfig config_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> probe_store_;  // a diagnosis's own connection (short timeout)
  bool agent_store_ = false;                     // torchrun's agent serves the store, not rank 0
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::thread heartbeat_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

// The plugin options every c10d-based comm plugin has.
#define AMPKIT_C10D_COMM_OPTIONS                                                                      \
  ampkit::OptionSpec::Float("heartbeat_seconds", "1",                                                 \
                            "Interval of the heartbeat each rank writes to the rendezvous store; "    \
                            "after a failed collective, a rank silent for 2.5 intervals is named as " \
                            "the lost one.")                                                          \
      .min(0.05)                                                                                      \
      .max(60)

}  // namespace ampkit::comm
