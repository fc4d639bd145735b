// The step's decisions computed on the gradients' device: the device rules the three
// strategies declare (sdk/include/ampkit/device_rules.h), from device tensors into device
// tensors, with no host read, by the functions their host forms run (ampkit/step_rules.h). The host forms
// stay the source of their state (save/load); this starts from it and must agree with it step for step, bit
// for bit (test_device_step).
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/device_rules.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>

#include <memory>
#include <string>

namespace ampkit {

// A step's inputs for the rules (DeviceStepRules::step): the scaled gradients' totals as 0-dim
// float64 tensors on the device (DeviceTotals), the loss and the group's element count where there are.
struct DeviceStepInputs {
  at::Tensor sum_squares;
  at::Tensor max_abs;
  at::Tensor zeros;
  at::Tensor loss;            // undefined: none
  at::Tensor group_elements;  // undefined: no reduction
};

// What DeviceStepRules::step gives: a fused optimizer's grad_scale and found_inf (float32), whether the step
// was taken (bool), and the step's record (float64: stepped, backoff, abort, clip coefficient,
// scale, next scale, loss, sum of squares, max-abs, zeros, then the group's element count where
// reduced), all on the device.
struct DeviceStepResult {
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

  // What the next backward multiplies the loss by: float32, 0-dim, on the device.
  const at::Tensor& scale() const { return scale_; }

  // Whether the rules can run on `device`: the CPU (ampkit_step_rules_run on the host), and CUDA
  // where this build holds the rules kernel. Elsewhere the step stays synchronous.
  static bool runs_on(const at::Device& device);
  // One step from start()'s state, as AmpStep::after_backward and finish_iteration decide it on the
  // host: the NaN policy's decision, the clip coefficient of a step taken, the scaler's extra
  // backoff and its update (cuda/step_rules_abi.h, composed of the built-in rules of
  // ampkit/step_rules.h), in one call; on a GPU one one-thread kernel. `scale` (float32, 0-dim: the
  // scale this step's backward used) becomes the next one in place. After an abort every later
  // step is refused (stepped 0). No host read.
  DeviceStepResult step(const DeviceStepInputs& in, at::Tensor& scale);

 private:
  ScalerDeviceRule scaler_;
  ClipperDeviceRule clipper_;
  NanPolicyDeviceRule policy_;
  at::Tensor scale_;  // float32: the scale start() found
  at::Tensor state_;  // float64 [growth, hysteresis, consecutive, stopped] (cuda/step_rules_abi.h)
};

}  // namespace ampkit
