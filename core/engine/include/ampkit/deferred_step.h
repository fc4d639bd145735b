// The step that never waits for the GPU (issue 42): the statistics, the strategies' decisions
// (their device rules, device_step.h) and the scale's update stay on the device, and a fused
// optimizer gets grad_scale and found_inf as device tensors, so a healthy step makes no host read.
// Each step's figures are copied to pinned host memory without blocking and delivered to the host
// forms (AmpStep::deliver: the strategies' state, the counters, the record) when they have arrived,
// at the latest one step later, in order, never lost, never twice; the device and host decisions
// are checked against each other on delivery.
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
  // the step synchronous, naming the kind ("scaler", "clipper", "nan_policy") in `kind` where a
  // strategy has no device form.
  static std::unique_ptr<DeferredStep> make(AmpStep& step, const GradientTable& table, std::string& kind,
                                            std::string& why);
  ~DeferredStep();
  DeferredStep(const DeferredStep&) = delete;
  DeferredStep& operator=(const DeferredStep&) = delete;

  // Whether the rules run fused (one call; on a GPU one kernel) or as ATen operators.
  bool fused() const { return fused_; }
  // The rules as ATen operators (false: what a build without the rules kernel runs on a GPU, and
  // what tests compare the fused call with), or fused where DeviceStepRules::fused_on allows.
  // Before the first step only: the two forms keep their state apart.
  void set_fused(bool on);

  // Whether records carry every gradient's norm (StepStats::tensor_norms, as the synchronous step
  // gives them): off by default; a copy of one number per chunk, summed on the host on delivery.
  void set_tensor_norms(bool on) { tensor_norms_ = on; }

  // What the next backward multiplies the loss by: float32, 0-dim, on the device, updated in place.
  const at::Tensor& scale() const { return scale_; }

  // After backward, for the gradients of `table` (read_gradients() first) and the step's mean
  // loss (undefined: none): statistics, decisions and the scale's update on the device, no host
  // read; the record's copy to the host is queued. Delivers what has arrived first, and waits for
  // the step before last, so no record is more than one step behind.
  DeferredGradients after_backward(GradientTable& table, const at::Tensor& loss);

  // Delivers the records that have arrived (every one with `wait`) to the host forms, in order.
  std::vector<StepOutcome> deliver(bool wait);
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending;
  DeferredStep(AmpStep& step, std::unique_ptr<DeviceStepRules> rules, bool fused);
  StepOutcome deliver_one(Pending& p);
  DeferredGradients step_operators(const DeviceTotals& t, const at::Tensor& loss, at::Tensor& record);

  AmpStep& step_;
  std::unique_ptr<DeviceStepRules> rules_;
  at::Tensor scale_;    // float32, persistent
  bool fused_;          // DeviceStepRules::step_fused (CPU; a GPU where the build has the rules kernel)
  bool begun_ = false;  // after_backward has run
  bool tensor_norms_ = false;
  std::deque<std::unique_ptr<Pending>> pending_;
};

}  // namespace ampkit
