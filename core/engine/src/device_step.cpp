// The strategies' device rules computed on the device (device_step.h): every branch of the host
// forms (scaler 'dynamic', the NaN policies, clip_grad_norm_'s coefficient) as masks over 0-dim
// tensors, each value rounded as the host rounds it (products in float64, scales in float32).
#include "ampkit/device_step.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <string>

#include "ampkit/error.h"
#include "cuda/step_rules_abi.h"
#include "step_rules_kernel.h"
#include "stream_use.h"

namespace ampkit {

namespace {

// A rule of at least the size this build knows, copied; an older, smaller struct is not offered.
template <class Rule>
bool read_rule(Strategy& strategy, const char* name, Rule& out) {
  const void* found = strategy.find_function(name);
  if (found == nullptr) return false;
  const auto* rule = static_cast<const Rule*>(found);
  if (rule->struct_size < sizeof(Rule)) return false;
  out = *rule;
  out.struct_size = sizeof(Rule);
  return true;
}

at::Tensor as_flag(const at::Tensor& condition) {
  return condition.to(at::kDouble);
}

// float(double(scale) * factor): the host forms' rounding.
at::Tensor times(const at::Tensor& scale, double factor) {
  return (scale.to(at::kDouble) * factor).to(at::kFloat);
}

}  // namespace

std::unique_ptr<DeviceStepRules> DeviceStepRules::of(LossScaler& scaler, GradClipper& clipper,
                                                     NanPolicy& policy, std::string& missing) {
  auto rules = std::make_unique<DeviceStepRules>();
  if (!read_rule(scaler, kScalerDeviceRule, rules->scaler_))
    missing = "scaler";
  else if (!read_rule(clipper, kClipperDeviceRule, rules->clipper_))
    missing = "clipper";
  else if (!read_rule(policy, kNanPolicyDeviceRule, rules->policy_))
    missing = "nan_policy";
  else
    return rules;
  return nullptr;
}

void DeviceStepRules::start(const LossScaler& scaler, const at::Device& device, int64_t consecutive_skips) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  scale_ =
      at::full({}, static_cast<float>(scaler.scale()), at::TensorOptions().dtype(at::kFloat).device(device));
  double growth = 0.0, hysteresis = 0.0;
  if (scaler_.kind == ScalerDeviceRule::Kind::dynamic) {
    const State s = scaler.save();
    if (!s.has("growth_tracker") || !s.has("hysteresis_tracker"))
      throw Error(ErrorCategory::plugin,
                  "the loss scaler declares a dynamic device rule but its state holds no growth_tracker and "
                  "hysteresis_tracker");
    growth = static_cast<double>(s.get<int64_t>("growth_tracker"));
    hysteresis = static_cast<double>(s.get<int64_t>("hysteresis_tracker"));
  }
  growth_ = at::full({}, growth, f64);
  hysteresis_ = at::full({}, hysteresis, f64);
  consecutive_ = at::full({}, static_cast<double>(consecutive_skips), f64);
  stopped_ = at::zeros({}, f64);
  state_ =
      at::tensor({growth, hysteresis, static_cast<double>(consecutive_skips), 0.0}, at::kDouble).to(device);
}

bool DeviceStepRules::fused_on(const at::Device& device) {
  return device.is_cpu() || (device.is_cuda() && step_rules_kernel_built());
}

namespace {

ampkit_step_rules flat_rules(const ScalerDeviceRule& scaler, const ClipperDeviceRule& clipper,
                             const NanPolicyDeviceRule& policy) {
  ampkit_step_rules r{};
  r.dynamic = scaler.kind == ScalerDeviceRule::Kind::dynamic;
  r.abort_at_min_scale = scaler.abort_at_min_scale;
  r.growth_factor = scaler.growth_factor;
  r.backoff_factor = scaler.backoff_factor;
  r.growth_interval = static_cast<double>(scaler.growth_interval);
  r.hysteresis = static_cast<double>(scaler.hysteresis);
  r.min_scale = scaler.min_scale;
  r.max_scale = scaler.max_scale;
  r.clip_norm = clipper.kind == ClipperDeviceRule::Kind::norm;
  r.inf_norm = clipper.inf_norm;
  r.max_norm = clipper.max_norm;
  r.policy_backoff = policy.backoff;
  r.abort_on_nonfinite_loss = policy.abort_on_nonfinite_loss;
  r.abort_on_nonfinite_gradients = policy.abort_on_nonfinite_gradients;
  r.max_consecutive = static_cast<double>(policy.max_consecutive);
  return r;
}

template <typename T>
const T* address(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

}  // namespace

FusedStepResult DeviceStepRules::step_fused(const FusedStepInputs& in, at::Tensor& scale) {
  if (!state_.defined()) throw Error(ErrorCategory::internal, "DeviceStepRules::step_fused before start()");
  const at::Device device = scale.device();
  if (!fused_on(device))
    throw Error(ErrorCategory::internal, "DeviceStepRules::step_fused: no rules kernel for " + device.str());
  const auto on = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(device); };
  FusedStepResult out;
  const at::Tensor factors = at::empty({2}, on(at::kFloat));  // grad_scale, found_inf
  out.grad_scale = factors.select(0, 0);
  out.found_inf = factors.select(0, 1);
  out.stepped = at::empty({}, on(at::kBool));
  out.record = at::empty(
      {in.group_elements.defined() ? AMPKIT_RECORD_GROUP_ELEMENTS + 1 : AMPKIT_RECORD_GROUP_ELEMENTS},
      on(at::kDouble));
  ampkit_step_pointers p{};
  p.sum_squares = address<double>(in.sum_squares);
  p.max_abs = address<double>(in.max_abs);
  p.zeros = address<double>(in.zeros);
  p.loss = address<double>(in.loss);
  p.group_elements = address<double>(in.group_elements);
  p.scale = scale.mutable_data_ptr<float>();
  p.state = state_.mutable_data_ptr<double>();
  p.grad_scale = out.grad_scale.mutable_data_ptr<float>();
  p.found_inf = out.found_inf.mutable_data_ptr<float>();
  p.stepped = reinterpret_cast<unsigned char*>(out.stepped.mutable_data_ptr<bool>());
  p.record = out.record.mutable_data_ptr<double>();
  const ampkit_step_rules rules = flat_rules(scaler_, clipper_, policy_);
  mark_used_on_current_stream(state_);  // kept between steps, made on the stream of start()
  if (device.is_cpu())
    ampkit_step_rules_run(&rules, &p);
  else
    launch_step_rules(rules, p, device);
  return out;
}

// The dynamic scaler's back_off() where `when`: the scale shrinks to max(float(scale *
// backoff_factor), min_scale), or, at min_scale with abort_at_min_scale, stays and the run stops.
at::Tensor DeviceStepRules::back_off(const at::Tensor& when, at::Tensor& aborted) {
  const at::Tensor min = at::full({}, scaler_.min_scale, scale_.options());
  const at::Tensor stops =
      scaler_.abort_at_min_scale ? at::logical_and(when, at::le(scale_, min)) : at::zeros_like(when);
  aborted = at::logical_or(aborted, stops);
  const at::Tensor reduced = at::maximum(times(scale_, scaler_.backoff_factor), min);
  return at::where(at::logical_and(when, at::logical_not(stops)), reduced, scale_);
}

// AmpStep::finish_iteration's scaler calls: the policy's extra backoff() (a stop there skips the
// update, as the host's TrainingAborted does), then update() with found_inf = `bad`.
void DeviceStepRules::update_dynamic(const at::Tensor& bad, const at::Tensor& backoff, at::Tensor& aborted) {
  growth_ = at::where(backoff, 0.0, growth_);
  scale_ = back_off(backoff, aborted);
  const at::Tensor runs = at::logical_not(aborted);
  // An overflow: the count restarts, one unit of the hysteresis budget is spent, and the scale
  // backs off once it is spent.
  const at::Tensor overflow = at::logical_and(runs, bad);
  growth_ = at::where(overflow, 0.0, growth_);
  hysteresis_ =
      at::where(at::logical_and(overflow, at::gt(hysteresis_, 0.0)), hysteresis_ - 1.0, hysteresis_);
  scale_ = back_off(at::logical_and(overflow, at::eq(hysteresis_, 0.0)), aborted);
  // A clean step counts; at growth_interval the scale grows where the product is finite, and the
  // count and the budget start again.
  const at::Tensor clean = at::logical_and(runs, at::logical_not(bad));
  growth_ = at::where(clean, growth_ + 1.0, growth_);
  const at::Tensor grows =
      at::logical_and(clean, at::eq(growth_, static_cast<double>(scaler_.growth_interval)));
  const at::Tensor grown = times(scale_, scaler_.growth_factor);
  const at::Tensor max = at::full({}, scaler_.max_scale, scale_.options());
  scale_ = at::where(at::logical_and(grows, at::isfinite(grown)), at::minimum(grown, max), scale_);
  growth_ = at::where(grows, 0.0, growth_);
  hysteresis_ = at::where(grows, static_cast<double>(scaler_.hysteresis), hysteresis_);
}

DeviceStepDecision DeviceStepRules::step(const DeviceStepStats& stats) {
  if (!scale_.defined()) throw Error(ErrorCategory::internal, "DeviceStepRules::step before start()");
  DeviceStepDecision d;
  d.scale = scale_.clone();
  const at::Tensor loss_bad = at::gt(stats.loss_nonfinite, 0.0);
  const at::Tensor grads_bad = at::gt(stats.grads_nonfinite, 0.0);
  const at::Tensor bad = at::logical_or(loss_bad, grads_bad);
  // 5. The NaN policy: a bad step is skipped; it aborts where its flags or its streak limit say.
  at::Tensor abort = at::zeros_like(bad);
  if (policy_.abort_on_nonfinite_loss) abort = at::logical_or(abort, loss_bad);
  if (policy_.abort_on_nonfinite_gradients)
    abort = at::logical_or(abort, at::logical_and(grads_bad, at::logical_not(loss_bad)));
  if (policy_.max_consecutive > 0)
    abort = at::logical_or(abort, at::logical_and(bad, at::ge(consecutive_ + 1.0,
                                                              static_cast<double>(policy_.max_consecutive))));
  const at::Tensor backoff =
      policy_.backoff ? at::logical_and(bad, at::logical_not(abort)) : at::zeros_like(bad);
  const at::Tensor stepped = at::logical_and(at::logical_not(bad), at::eq(stopped_, 0.0));
  // 6. The clip coefficient of a step taken: clip_grad_norm_'s max_norm / (norm + 1e-6), at most 1.
  d.clip_coefficient = at::ones({}, stats.grad_norm.options());
  if (clipper_.kind == ClipperDeviceRule::Kind::norm) {
    const at::Tensor total = clipper_.inf_norm ? stats.grad_max_abs : stats.grad_norm;
    const at::Tensor coefficient = at::full({}, clipper_.max_norm, total.options()).div(total + 1e-6);
    d.clip_coefficient = at::where(at::logical_and(stepped, at::lt(coefficient, 1.0)), coefficient, 1.0);
  }
  // 8. The scaler: the policy's extra backoff, then its update.
  at::Tensor scaler_stops = at::zeros_like(bad);
  if (scaler_.kind == ScalerDeviceRule::Kind::dynamic) update_dynamic(bad, backoff, scaler_stops);
  const at::Tensor stops = at::logical_or(abort, scaler_stops);
  d.stepped = as_flag(stepped);
  d.backoff = as_flag(backoff);
  d.abort = as_flag(stops);
  d.scale_next = scale_.clone();
  stopped_ = at::maximum(stopped_, d.abort);
  consecutive_ = at::where(stepped, 0.0, consecutive_ + 1.0);
  return d;
}

}  // namespace ampkit
