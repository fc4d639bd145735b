// The step that never waits for the GPU: the statistics, the strategies' decisions
// (their device rules, device_step.h) and the scale's update stay on the device, and a fused
// optimizer gets grad_scale and found_inf as device tensors, so a healthy step makes no host read.
// Each step's figures are copied to pinned host memory without blocking and delivered to the host
// forms (AmpStep::deliver: the strategies' state, the counters, the record) when they have arrived,
// at the latest one step later, in order, never lost, never twice; the device and host decisions
// are checked against each other on delivery.
//
// A step captured in a CUDA graph (ampkit.GradScaler inside torch.cuda.graph) runs again at every
// replay with no host code between replays: its record is written to a ring on the device at the
// row a device counter names, and the host reads the rows written since its last read when it
// needs the host forms (deliver(true): last_step, state_dict, a checkpoint). From the first capture
// on, every record of this step, captured or not, goes through the ring, so the order stays the
// device's.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/amp_step.h>
#include <ampkit/device_step.h>
#include <ampkit/gradient_table.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace c10 {
class Event;
}

namespace ampkit {

// What a fused optimizer takes for one deferred step: 0-dim tensors on the gradients' device.
struct DeferredGradients {
  at::Tensor grad_scale;  // float32: scale / clip coefficient (the optimizer divides by it)
  at::Tensor found_inf;   // float32: 1 where the step is skipped
  at::Tensor stepped;     // bool: whether the step was taken (reading it waits for the device)
};

class DeferredStep {
 public:
  // The deferred step for `table` with `step`'s strategies, or nullptr with `why` saying what keeps
  // the step synchronous (the device's kernels refused or not in this build, a recipe without a
  // deferred form), naming the kind ("scaler", "clipper", "nan_policy") in `kind` where a
  // strategy has no device form.
  static std::unique_ptr<DeferredStep> make(AmpStep& step, const GradientTable& table, std::string& kind,
                                            std::string& why);
  ~DeferredStep();
  DeferredStep(const DeferredStep&) = delete;
  DeferredStep& operator=(const DeferredStep&) = delete;

  // Whether records carry every gradient's norm (StepStats::tensor_norms, as the synchronous step
  // gives them): off by default; a copy of one number per chunk, summed on the host on delivery.
  void set_tensor_norms(bool on) { tensor_norms_ = on; }

  // What the next backward multiplies the loss by: float32, 0-dim, on the device, updated in place.
  const at::Tensor& scale() const { return scale_; }

  // After backward, for the gradients of `table` (read_gradients() first) and the step's mean
  // loss (undefined: none): statistics, decisions and the scale's update on the device, no host
  // read; the record's copy to the host is queued. Delivers what has arrived first, and waits for
  // the step before last, so no record is more than one step behind.
  // `capturing`: the caller's stream is capturing a CUDA graph. The step's work is only recorded
  // (it runs at each replay), its record goes to the ring, and nothing is delivered or waited for.
  // A step is captured only after one has run uncaptured (the ring is allocated then, outside the
  // graph), with the same loss and gradients as the steps before it.
  DeferredGradients after_backward(GradientTable& table, const at::Tensor& loss, bool capturing = false);

  // Delivers the records that have arrived (every one with `wait`) to the host forms, in order;
  // with `wait`, also every row the ring holds (two host reads: the count, then the rows). The
  // records after_backward delivered come first (it delivers what has arrived, and waits for the
  // step before last): none is lost, an abort among them included.
  // More rows written since the last read than the ring holds is a usage error, raised now and by
  // every later call: their steps ran on the device, the host forms cannot follow them.
  // With `wait`, `newest` says what becomes of the newest record, whose iteration may still be open
  // (between the caller's step and its update): delivered like the others; held back (a host read
  // inside the iteration sees the state before the iteration's update, as torch's GradScaler shows
  // it); or opened (AmpStep::deliver_open: its decision is checked against the device's and the
  // host forms take the iteration over, for the caller to finish; it is not among those returned;
  // this object's device state is then stale, and the caller drops it).
  enum class Newest { deliver, hold, open };
  std::vector<StepOutcome> deliver(bool wait, Newest newest = Newest::deliver);
  size_t pending() const { return pending_.size(); }
  // A CPU record arrives only when waited for, or when the step after next begins, as a GPU's may
  // (its copy still under way): tests run the order of delivery a GPU can give on a CPU.
  void set_late_arrivals(bool on) { late_arrivals_ = on; }

  // Whether a step has been captured (its records go through the ring from then on).
  bool in_graph() const { return in_graph_; }
  // Ring rows written since the last read (one host read): a graph replayed since.
  int64_t unread_rows() const;
  // Lets a CUDA graph capture this step (before the first step only): the first step allocates the
  // ring, `ring_rows` records (how many steps may run between two reads once a step was captured).
  // Without it (the Trainer, which captures nothing) there is no ring and a capture is refused.
  static constexpr int64_t kDefaultRingRows = 16384;
  void allow_graphs(int64_t ring_rows = kDefaultRingRows);

 private:
  struct Pending;
  DeferredStep(AmpStep& step, std::unique_ptr<DeviceStepRules> rules);
  StepOutcome deliver_one(Pending& p, bool open);
  void deliver_into(Pending& p, std::vector<StepOutcome>& delivered, bool open = false);
  void check_ring_shape(const Pending& shape);
  void write_ring(const at::Tensor& record);
  void deliver_ring(std::vector<StepOutcome>& delivered, int64_t written, Newest newest);

  AmpStep& step_;
  std::unique_ptr<DeviceStepRules> rules_;
  at::Tensor scale_;    // float32, persistent
  bool begun_ = false;  // after_backward has run
  bool tensor_norms_ = false;
  std::deque<std::unique_ptr<Pending>> pending_;
  // The ring (CUDA graphs): [rows, AMPKIT_RECORD_GROUP_ELEMENTS + 1] float64 and the count of rows
  // written (int64, 0-dim), on the device, allocated by the first step after allow_graphs().
  int64_t ring_rows_ = 0;  // 0: no graphs (allow_graphs)
  at::Tensor ring_;
  at::Tensor ring_written_;
  int64_t ring_read_ = 0;
  std::unique_ptr<Pending> ring_shape_;  // what every ring row's step was measured over
  bool in_graph_ = false;
  bool aborted_ = false;  // a delivered record aborted: the later ones are dropped
  bool late_arrivals_ = false;
  std::vector<StepOutcome> held_;  // delivered by after_backward, returned by the next deliver()
  std::string broken_;             // why no later call can run (rows lost)
};

}  // namespace ampkit
