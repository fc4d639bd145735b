// The step's decisions computed on the gradients' device: the device rules the three
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

// A step's inputs for the fused rules (step_fused): the scaled gradients' totals as 0-dim float64
// tensors on the device (DeviceTotals), the loss and the group's element count where there are.
struct FusedStepInputs {
  at::Tensor sum_squares;
  at::Tensor max_abs;
  at::Tensor zeros;
  at::Tensor loss;            // undefined: none
  at::Tensor group_elements;  // undefined: no reduction
};

// What step_fused gives: a fused optimizer's grad_scale and found_inf (float32), whether the step
// was taken (bool), and the step's record (float64: stepped, backoff, abort, clip coefficient,
// scale, next scale, loss, sum of squares, max-abs, zeros, then the group's element count where
// reduced), all on the device.
struct FusedStepResult {
  at::Tensor grad_scale;
  at::Tensor found_inf;
  at::Tensor stepped;
  at::Tensor record;
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

  // The same rules, fused: one scalar function over the totals (cuda/step_rules_abi.h), run on the
  // host for CPU tensors and as one one-thread kernel on a GPU, where step() runs some 130 ATen
  // operators. Whether it can run on `device` (CPU; CUDA where this build holds the kernel).
  static bool fused_on(const at::Device& device);
  // One step from start()'s state (a DeviceStepRules steps by step() or by step_fused(), not by
  // both): `scale` (float32, 0-dim: the scale this step's backward used) becomes the next one in
  // place. No host read.
  FusedStepResult step_fused(const FusedStepInputs& in, at::Tensor& scale);

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
  at::Tensor state_;        // step_fused's: float64 [growth, hysteresis, consecutive, stopped]
};

}  // namespace ampkit
