// The NaN locator (docs/troubleshooting-nan.md, "The locator report").
#include "ampkit/nan_locator.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "ampkit/error.h"
#include "ampkit/forward_hook.h"
#include "ampkit/trainer.h"

namespace ampkit {

namespace {

TensorSummary summarize(const at::Tensor& t) {
  TensorSummary o;
  if (!t.defined()) return o;
  o.dtype = c10::toString(t.scalar_type());
  o.shape = t.sizes().vec();
  if (t.numel() == 0) return o;
  at::NoGradGuard no_grad;
  const at::Tensor x = t.detach().to(at::kDouble);
  const at::Tensor finite = at::isfinite(x);
  o.nonfinite = x.numel() - finite.sum().item<int64_t>();
  if (o.nonfinite == x.numel()) return o;
  const at::Tensor zeros = at::zeros({}, x.options());
  o.min = at::where(finite, x, at::full({}, INFINITY, x.options())).min().item<double>();
  o.max = at::where(finite, x, at::full({}, -INFINITY, x.options())).max().item<double>();
  o.absmax = at::where(finite, at::abs(x), zeros).max().item<double>();
  return o;
}

ModuleObservation observe(const std::string& module, const std::string& phase, const at::Tensor& value,
                          const at::Tensor& input = at::Tensor()) {
  return {module, phase, summarize(value), summarize(input)};
}

// Records every tapped output and, through a hook, the gradient of each output.
class RecordingHook final : public ForwardHook {
 public:
  at::Tensor on_output(const std::string& module, const at::Tensor& input, at::Tensor output) override {
    forward.push_back(observe(module, "forward", output, input));
    if (output.requires_grad()) {
      output.register_hook([this, module](const at::Tensor& g) {
        std::lock_guard<std::mutex> lock(mutex_);  // CUDA backward may run hooks on other threads
        backward.push_back(observe(module, "backward", g));
      });
    }
    return output;
  }
  std::vector<ModuleObservation> forward, backward;

 private:
  std::mutex mutex_;
};

struct Run {
  double loss = 0;
  std::vector<ModuleObservation> forward, backward;
  std::vector<ModuleObservation> parameters;  // gradients, in backward order (LocatorInputs::parameter_names)
};

// Hooks on the parameters' gradients for one re-run, removed again when it ends.
class ParameterGradients {
 public:
  ParameterGradients(const std::vector<at::Tensor>& parameters, const std::vector<std::string>& names)
      : parameters_(parameters) {
    if (names.size() != parameters.size()) return;
    for (size_t i = 0; i < parameters.size(); ++i) {
      at::Tensor p = parameters[i];
      if (!p.requires_grad()) {
        handles_.push_back(-1);
        continue;
      }
      handles_.push_back(static_cast<int64_t>(p.register_hook([this, name = names[i]](const at::Tensor& g) {
        std::lock_guard<std::mutex> lock(mutex_);
        seen.push_back(observe(name, "parameter", g));
      })));
    }
  }
  ~ParameterGradients() {
    for (size_t i = 0; i < handles_.size(); ++i)
      if (handles_[i] >= 0)
        const_cast<at::Tensor&>(parameters_[i]).remove_hook(static_cast<unsigned>(handles_[i]));
  }
  std::vector<ModuleObservation> seen;

 private:
  const std::vector<at::Tensor>& parameters_;
  std::vector<int64_t> handles_;
  std::mutex mutex_;
};

Run run_once(const std::function<at::Tensor()>& loss_fn, const LocatorInputs& in,
             const std::vector<at::Tensor>& parameters) {
  RecordingHook hook;
  ParameterGradients parameter_gradients(parameters, in.parameter_names);
  at::Tensor loss;
  const c10::DeviceType device = parameters.empty() ? c10::kCPU : parameters.front().device().type();
  {
    ForwardHookScope scope(&hook);
    AutocastGuard autocast(in.precision, device);
    loss = loss_fn();
  }
  if (!loss.defined() || loss.numel() != 1)
    throw Error(ErrorCategory::internal, "the forward function must return a scalar loss");
  loss = loss.to(at::kFloat);
  Run r;
  r.loss = loss.item<double>();
  if (loss.requires_grad()) (loss * (in.scale / in.accumulation_steps)).backward();
  for (const auto& p : parameters) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  r.forward = std::move(hook.forward);
  r.backward = std::move(hook.backward);
  r.parameters = std::move(parameter_gradients.seen);
  return r;
}

double ratio(double bad, double reference) {
  return bad / std::max(reference, 1e-30);
}

// Index of the first observation whose |value| max exceeds `limit` times the reference run's
// at the same position, or -1. Stops where the two runs took different paths.
int first_jump(const std::vector<ModuleObservation>& bad, const std::vector<ModuleObservation>& good,
               double limit, double* q_out) {
  for (size_t i = 0; i < bad.size() && i < good.size(); ++i) {
    if (bad[i].module != good[i].module) break;
    if (bad[i].value.nonfinite > 0) break;
    const double q = ratio(bad[i].value.absmax, good[i].value.absmax);
    if (q > limit) {
      *q_out = q;
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string jump_text(const char* what, double q) {
  char line[160];
  std::snprintf(line, sizeof line, "first %s whose largest |value| is %.3gx that of a healthy batch", what,
                q);
  return line;
}

// A model that reports no module outputs (a TorchScript module): what can be said is whether the
// loss went non-finite and which parameter's gradient did first, never a layer that was not seen.
void first_nonfinite_parameter(const Run& r, NanLocation& loc) {
  const std::string unseen =
      "the model reports no module outputs (a TorchScript module cannot be observed from C++)";
  const std::string loss = std::isfinite(r.loss) ? "" : "the loss is non-finite; ";
  for (const auto& o : r.parameters) {
    if (o.value.nonfinite == 0) continue;
    loc.found = true;
    loc.parameter = o.module;
    loc.phase = "parameter";
    loc.finding = loss + unseen + "; first parameter whose gradient went non-finite, in backward order: '" +
                  o.module + "'";
    loc.observation = o;
    return;
  }
  if (!loss.empty()) {
    loc.found = true;
    loc.phase = "loss";
    loc.finding = loss + unseen;
  }
}

// The first non-finite value of one micro-batch's re-run: a module output, the loss, or a module's
// output gradient (backward order); a non-finite gradient under finite activations is blamed on
// the first output that jumped against a healthy batch, when a reference is given.
NanLocation first_nonfinite_in(Run& r, int micro, const LocatorInputs& in,
                               const std::vector<at::Tensor>& parameters) {
  NanLocation loc;
  loc.micro_batch = micro;
  loc.loss = r.loss;
  const auto first_nonfinite = [&loc](const std::vector<ModuleObservation>& seen, const char* phase,
                                      const char* finding) {
    for (const auto& o : seen) {
      if (o.value.nonfinite == 0) continue;
      loc.found = true;
      loc.module = o.module;
      loc.phase = phase;
      loc.finding = finding;
      loc.observation = o;
      return;
    }
  };
  first_nonfinite(r.forward, "forward", "first non-finite output");
  if (r.forward.empty() && !in.parameter_names.empty()) {
    first_nonfinite_parameter(r, loc);  // nothing observed but the parameters' gradients
  } else {
    if (!loc.found && !std::isfinite(r.loss)) {
      loc.found = true;
      loc.phase = "loss";
      loc.finding = "the loss is non-finite while every module output is finite: look at the loss function";
    }
    if (!loc.found)
      first_nonfinite(r.backward, "backward",
                      "first non-finite gradient (backward order) of a module's output");
  }
  if (loc.found && loc.phase == "backward" && in.reference) {
    // Gradients that overflow under finite activations often follow a spike upstream: name it.
    const Run ref = run_once(in.reference, in, parameters);
    double q = 0;
    const int i = first_jump(r.forward, ref.forward, in.spike_ratio, &q);
    if (i >= 0) {
      loc.finding = jump_text("output", q) + "; then the gradient of '" + loc.module + "' went non-finite";
      loc.module = r.forward[i].module;
      loc.phase = "forward";
      loc.observation = r.forward[i];
      loc.reference_absmax = ref.forward[i].value.absmax;
    }
  }
  if (loc.found) {
    loc.forward = std::move(r.forward);
    loc.backward = std::move(r.backward);
  }
  return loc;
}

// No non-finite value anywhere: the module whose magnitude jumped most against a healthy batch.
NanLocation largest_jump(const std::vector<Run>& runs, const LocatorInputs& in,
                         const std::vector<at::Tensor>& parameters) {
  NanLocation best;
  const Run ref = run_once(in.reference, in, parameters);
  double best_ratio = 0;
  for (size_t m = 0; m < runs.size(); ++m) {
    const Run& r = runs[m];
    double q = 0;
    const char* phase = "forward";
    int i = first_jump(r.forward, ref.forward, in.spike_ratio, &q);
    // Every output normal but the loss jumped: the loss function (or its labels) did it, and
    // every gradient below it is only scaled by it, so no layer is to blame.
    const double loss_q = ratio(std::abs(r.loss), std::abs(ref.loss));
    if (i < 0 && loss_q > in.spike_ratio) {
      if (loss_q <= best_ratio) continue;
      best_ratio = loss_q;
      best = NanLocation{};
      best.found = true;
      best.micro_batch = static_cast<int>(m);
      best.loss = r.loss;
      best.phase = "loss";
      char line[200];
      std::snprintf(line, sizeof line,
                    "the loss is %.3gx that of a healthy batch while every module output is within %gx: "
                    "look at the loss function and the labels",
                    loss_q, in.spike_ratio);
      best.finding = line;
      best.reference_absmax = std::abs(ref.loss);
      best.forward = r.forward;
      best.backward = r.backward;
      continue;
    }
    if (i < 0) {
      phase = "backward";
      i = first_jump(r.backward, ref.backward, in.spike_ratio, &q);
    }
    if (i < 0 || q <= best_ratio) continue;
    const ModuleObservation& o = (phase[0] == 'f' ? r.forward : r.backward)[static_cast<size_t>(i)];
    best_ratio = q;
    best = NanLocation{};
    best.found = true;
    best.micro_batch = static_cast<int>(m);
    best.loss = r.loss;
    best.module = o.module;
    best.phase = phase;
    best.finding = jump_text(phase[0] == 'f' ? "output" : "output gradient", q);
    best.observation = o;
    best.reference_absmax =
        (phase[0] == 'f' ? ref.forward : ref.backward)[static_cast<size_t>(i)].value.absmax;
    best.forward = r.forward;
    best.backward = r.backward;
  }
  return best;
}

// What a re-run found when nothing in it was non-finite.
void nothing_found(NanLocation& loc, double spike_ratio) {
  loc.finding = "the re-run found no non-finite value and no module more than " +
                std::to_string(static_cast<int>(spike_ratio)) + "x a healthy batch";
}

}  // namespace

struct LocatorRecording::Recording {
  RecordingHook hook;
  std::unique_ptr<ForwardHookScope> scope;
};

LocatorRecording::LocatorRecording() : recording_(std::make_unique<Recording>()) {
  recording_->scope = std::make_unique<ForwardHookScope>(&recording_->hook);
}

LocatorRecording::~LocatorRecording() = default;

NanLocation LocatorRecording::finish(double loss) {
  if (!recording_->scope) throw Error(ErrorCategory::usage, "the locator's recording was already finished");
  recording_->scope.reset();
  Run r;
  r.loss = loss;
  r.forward = std::move(recording_->hook.forward);
  r.backward = std::move(recording_->hook.backward);
  const LocatorInputs no_reference;
  NanLocation loc = first_nonfinite_in(r, 0, no_reference, {});
  if (!loc.found) {
    nothing_found(loc, no_reference.spike_ratio);
    loc.loss = loss;
    loc.forward = std::move(r.forward);
    loc.backward = std::move(r.backward);
  }
  return loc;
}

NanLocation locate_fault(const LocatorInputs& in, const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  std::vector<Run> runs;
  for (int micro = 0; micro < in.micro_batches; ++micro) {
    Run r = run_once([&] { return in.forward(micro); }, in, parameters);
    NanLocation loc = first_nonfinite_in(r, micro, in, parameters);
    if (loc.found) return loc;
    runs.push_back(std::move(r));
  }
  NanLocation best;
  if (in.reference && !runs.empty()) best = largest_jump(runs, in, parameters);
  if (!best.found) {
    nothing_found(best, in.spike_ratio);
    if (!runs.empty()) {
      best.loss = runs.front().loss;
      best.forward = runs.front().forward;
      best.backward = runs.front().backward;
    }
  }
  return best;
}

}  // namespace ampkit
