// The step's decisions computed on the gradients' device (issue 42): the device rules the three
// strategies declare (sdk/include/ampkit/device_rules.h), from device tensors into device
// tensors, with no host read. The host forms stay the source of their state (save/load); this
// starts from it and must agree with it step for step, bit for bit (test_device_step).
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/device_rules.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>

#include <memory>
#include <string>

namespace ampkit {

// One step's statistics as 0-dim float64 tensors on the device: what StepStats holds on the host.
struct DeviceStepStats {
  at::Tensor loss_nonfinite;   // 1 where the loss is not finite, else 0
  at::Tensor grads_nonfinite;  // 1 where some gradient element is not finite, else 0
  at::Tensor grad_norm;        // unscaled L2 norm of all gradients
  at::Tensor grad_max_abs;     // unscaled largest |gradient|
};

// One step's decisions, 0-dim tensors on the device (float64 flags are 1 or 0).
struct DeviceStepDecision {
  at::Tensor stepped;           // the optimizer steps (a fused optimizer's found_inf is 1 - stepped)
  at::Tensor backoff;           // the NaN policy asked the scaler for one more backoff (skip_backoff)
  at::Tensor abort;             // the run stops here (the NaN policy or the scaler)
  at::Tensor clip_coefficient;  // float64; 1 on a step not taken
  at::Tensor scale;             // float32: the scale this step's backward used
  at::Tensor scale_next;        // float32: the scale after the scaler's update
};

class DeviceStepRules {
 public:
  // The rules the strategies declare, or nullptr with `missing` set to the kind ("scaler",
  // "clipper", "nan_policy") of the first strategy that declares none.
  static std::unique_ptr<DeviceStepRules> of(LossScaler& scaler, GradClipper& clipper, NanPolicy& policy,
                                             std::string& missing);

  // The device state from the strategies' current state (the scaler's scale and save()), on
  // `device`; `consecutive_skips` as the host counted them. Call again after a host load().
  void start(const LossScaler& scaler, const at::Device& device, int64_t consecutive_skips);

  // One step, as AmpStep::after_backward and finish_iteration decide it on the host: the NaN
  // policy's decision, the clip coefficient of a step taken, the scaler's extra backoff and its
  // update. After an abort every later step is refused (stepped 0).
  DeviceStepDecision step(const DeviceStepStats& stats);

  // What the next backward multiplies the loss by: float32, 0-dim, on the device.
  const at::Tensor& scale() const { return scale_; }

 private:
  at::Tensor back_off(const at::Tensor& when, at::Tensor& aborted);  // returns the new scale
  void update_dynamic(const at::Tensor& bad, const at::Tensor& backoff, at::Tensor& aborted);

  ScalerDeviceRule scaler_;
  ClipperDeviceRule clipper_;
  NanPolicyDeviceRule policy_;
  at::Tensor scale_;        // float32
  at::Tensor growth_;       // float64 counts (dynamic)
  at::Tensor hysteresis_;   // float64 (dynamic)
  at::Tensor consecutive_;  // float64: bad steps in a row
  at::Tensor stopped_;      // float64: 1 once a step aborted
};

}  // namespace ampkit
