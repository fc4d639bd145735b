// Device forms of the step's strategies: a strategy whose part of the step can run on
// the gradients' device, with no host read, declares its rule here, as plain numbers, through
// find_function; the engine computes that rule from device tensors into device tensors, step after
// step (core/engine/include/ampkit/device_step.h). A declaration, not code: scalers and NaN
// policies link no ATen, and what find_function returns is used outside the plugin-call guard, so
// it must not be able to fail. A strategy offers a rule only where the rule is exactly its host
// form, for the options it was made with (the built-ins are checked step for step, bit for bit);
// where it offers none (nullptr) the step stays synchronous and the run says which strategy kept
// it so. The built-in rules themselves are written once, in step_rules.h.
#pragma once

#include <ampkit/step_rules.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ampkit {

// The names find_function is asked for; each returns a `const <Kind>DeviceRule*` that stays valid
// while the strategy lives, or nullptr.
inline constexpr const char* kScalerDeviceRule = "ampkit_scaler_device_rule";
inline constexpr const char* kClipperDeviceRule = "ampkit_clipper_device_rule";
inline constexpr const char* kNanPolicyDeviceRule = "ampkit_nan_policy_device_rule";

// A loss scaler's rule. The scale is a float32, as torch.amp.GradScaler's; the scaler's save()
// holds the state the device starts from ("scale"; dynamic: "growth_tracker", "hysteresis_tracker").
struct ScalerDeviceRule {
  uint32_t struct_size = sizeof(ScalerDeviceRule);
  enum class Kind : uint32_t {
    constant,  // the scale never changes
    dynamic,   // torch's rule, with Megatron's hysteresis and the bounds (scaler 'dynamic')
  };
  Kind kind = Kind::constant;
  // dynamic: a clean step counts towards growth_interval, at which the scale becomes
  // min(float(scale * growth_factor), max_scale) (kept where that is not finite) and the
  // hysteresis budget is restored; an overflow restarts the count and spends one unit of the
  // budget, and the scale becomes max(float(scale * backoff_factor), min_scale) when it is spent.
  // A NaN policy's extra backoff restarts the count and backs off once. A backoff asked for at
  // min_scale with abort_at_min_scale stops the run instead (the host form's TrainingAborted).
  // (The functions of step_rules.h, which scaler 'dynamic' runs.)
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  float min_scale = 1.0f;
  float max_scale = 3.4028234663852886e+38f;
  bool abort_at_min_scale = false;
  // Added later (a host reads an older, shorter rule with this at its default): the count restarts
  // at -growth_delay where an overflow or an extra backoff restarts it, and at the start.
  int64_t growth_delay = 0;
};

// The struct_size of ScalerDeviceRule's first layout, the shortest a host reads.
inline constexpr uint32_t kScalerDeviceRuleFirstSize = offsetof(ScalerDeviceRule, growth_delay);

// A gradient clipper's rule: one coefficient for all gradients.
struct ClipperDeviceRule {
  uint32_t struct_size = sizeof(ClipperDeviceRule);
  enum class Kind : uint32_t {
    none,  // coefficient 1
    norm,  // min(1, max_norm / (norm + 1e-6)), norm the unscaled L2 or inf norm (clip_grad_norm_)
  };
  Kind kind = Kind::none;
  double max_norm = 0.0;
  bool inf_norm = false;
};

// A NaN policy's rule over a step's non-finite loss and gradients (no spike detection: a policy
// that detects spikes offers no rule). A bad step (loss or gradients not finite) is skipped; the
// flags say what else it does.
struct NanPolicyDeviceRule {
  uint32_t struct_size = sizeof(NanPolicyDeviceRule);
  bool backoff = false;  // skip_backoff: the scaler backs off once more
  bool abort_on_nonfinite_loss = false;
  bool abort_on_nonfinite_gradients = false;  // (with a finite loss)
  int64_t max_consecutive = 0;                // abort at this many bad steps in a row; 0: never
};

// The declared numbers as the built-in rules' functions (step_rules.h) take them: a host form that
// calls those functions with these is its device rule, by construction.
inline ampkit_dynamic_scaler_rule step_rule_of(const ScalerDeviceRule& r) {
  ampkit_dynamic_scaler_rule out{};
  out.growth_factor = r.growth_factor;
  out.backoff_factor = r.backoff_factor;
  out.growth_interval = r.growth_interval;
  out.hysteresis = r.hysteresis;
  out.min_scale = r.min_scale;
  out.max_scale = r.max_scale;
  out.abort_at_min_scale = r.abort_at_min_scale;
  out.growth_delay = r.growth_delay;
  return out;
}

inline ampkit_nan_policy_rule step_rule_of(const NanPolicyDeviceRule& r) {
  ampkit_nan_policy_rule out{};
  out.backoff = r.backoff;
  out.abort_on_nonfinite_loss = r.abort_on_nonfinite_loss;
  out.abort_on_nonfinite_gradients = r.abort_on_nonfinite_gradients;
  out.max_consecutive = r.max_consecutive;
  return out;
}

// What a strategy's find_function returns for its rule: `rule` when `asked` is `name`, else nullptr.
//   void* find_function(const char* name) override {
//     return ampkit::offer_rule(name, ampkit::kClipperDeviceRule, &rule_);
//   }
inline void* offer_rule(const char* asked, const char* name, const void* rule) {
  if (asked == nullptr || rule == nullptr || std::strcmp(asked, name) != 0) return nullptr;
  return const_cast<void*>(rule);
}

}  // namespace ampkit
