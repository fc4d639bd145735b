// The strategies' device rules computed on the device (device_step.h): the declared numbers handed
// to the one scalar function (cuda/step_rules_abi.h) that composes the host forms' own rules
// (ampkit/step_rules.h), run on the host for CPU tensors and as one kernel on a GPU.
#include "ampkit/device_step.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "ampkit/error.h"
#include "cuda/step_rules_abi.h"
#include "step_rules_kernel.h"
#include "stream_use.h"

namespace ampkit {

namespace {

// A rule copied as far as its struct_size and this build's layout go, later fields at their
// defaults (a plugin built before they were added); one shorter than `first_size` is not offered.
template <class Rule>
bool read_rule(Strategy& strategy, const char* name, Rule& out, size_t first_size = sizeof(Rule)) {
  const void* found = strategy.find_function(name);
  if (found == nullptr) return false;
  const auto* rule = static_cast<const Rule*>(found);
  if (rule->struct_size < first_size) return false;
  out = Rule{};
  std::memcpy(static_cast<void*>(&out), rule, std::min<size_t>(rule->struct_size, sizeof(Rule)));
  out.struct_size = sizeof(Rule);
  return true;
}

}  // namespace

std::unique_ptr<DeviceStepRules> DeviceStepRules::of(LossScaler& scaler, GradClipper& clipper,
                                                     NanPolicy& policy, std::string& missing) {
  auto rules = std::make_unique<DeviceStepRules>();
  if (!read_rule(scaler, kScalerDeviceRule, rules->scaler_, kScalerDeviceRuleFirstSize))
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
  state_ =
      at::tensor({growth, hysteresis, static_cast<double>(consecutive_skips), 0.0}, at::kDouble).to(device);
}

bool DeviceStepRules::runs_on(const at::Device& device) {
  return device.is_cpu() || (device.is_cuda() && step_rules_kernel_built());
}

namespace {

ampkit_step_rules flat_rules(const ScalerDeviceRule& scaler, const ClipperDeviceRule& clipper,
                             const NanPolicyDeviceRule& policy) {
  ampkit_step_rules r{};
  r.dynamic = scaler.kind == ScalerDeviceRule::Kind::dynamic;
  r.scaler = step_rule_of(scaler);
  r.clip_norm = clipper.kind == ClipperDeviceRule::Kind::norm;
  r.inf_norm = clipper.inf_norm;
  r.max_norm = clipper.max_norm;
  r.policy = step_rule_of(policy);
  return r;
}

template <typename T>
const T* address(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

}  // namespace

DeviceStepResult DeviceStepRules::step(const DeviceStepInputs& in, at::Tensor& scale) {
  if (!state_.defined()) throw Error(ErrorCategory::internal, "DeviceStepRules::step before start()");
  const at::Device device = scale.device();
  if (!runs_on(device))
    throw Error(ErrorCategory::internal, "DeviceStepRules::step: no rules kernel for " + device.str());
  const auto on = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(device); };
  DeviceStepResult out;
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

}  // namespace ampkit
