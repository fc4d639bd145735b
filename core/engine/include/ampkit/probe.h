// Hook points in a model's forward: fault injection and the NaN locator see module outputs.
//
// LibTorch's C++ nn::Module has no forward hooks, so a model calls tap() with each module's
// input and output, named by the module's path in named_modules() ("layers.1", "blocks.0.fc"),
// or lets call() do it: `x = call("layers.1", layer, x)`. On a
// healthy step no probe is active and tap() is one branch; probes are installed only for a
// step with an injected fault and for the locator's re-run.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace ampkit {

class Probe {
 public:
  virtual ~Probe() = default;
  // Sees (and may replace) the output of `module`; may register gradient hooks on it.
  virtual at::Tensor on_output(const std::string& module, const at::Tensor& input, at::Tensor output) = 0;
};

namespace detail {
bool any_probe_active();
at::Tensor run_probes(const std::string& module, const at::Tensor& input, at::Tensor output);
}  // namespace detail

// Reports a module's output to the active probes (innermost scope first) and returns what they
// make of it; without a probe, the output itself.
inline at::Tensor tap(const std::string& module, const at::Tensor& input, at::Tensor output) {
  if (!detail::any_probe_active()) return output;
  return detail::run_probes(module, input, std::move(output));
}

// module->forward(input), tapped.
template <class ModuleHolder>
at::Tensor call(const std::string& module, ModuleHolder& m, const at::Tensor& input) {
  return tap(module, input, m->forward(input));
}

// Makes `probe` active on this thread for the scope's lifetime. Scopes nest: the innermost
// probe sees an output first, so a fault injected inside a locator's scope is what it records.
class ProbeScope {
 public:
  explicit ProbeScope(Probe* probe);
  ~ProbeScope();
  ProbeScope(const ProbeScope&) = delete;
  ProbeScope& operator=(const ProbeScope&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace ampkit
