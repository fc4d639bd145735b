// Hook points in a model's forward: fault injection and the NaN locator see module outputs.
//
// LibTorch's C++ nn::Module has no forward hooks, so a model calls tap() with each module's
// input and output, named by the module's path in named_modules() ("layers.1", "blocks.0.fc"),
// or lets call() do it: `x = call("layers.1", layer, x)`. On a
// healthy step no hook is active and tap() is one branch; hooks are installed only for a
// step with an injected fault and for the locator's re-run.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace ampkit {

class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  // Sees (and may replace) the output of `module`; may register gradient hooks on it.
  virtual at::Tensor on_output(const std::string& module, const at::Tensor& input, at::Tensor output) = 0;
};

namespace detail {
bool any_forward_hook_active();
at::Tensor run_forward_hooks(const std::string& module, const at::Tensor& input, at::Tensor output);
}  // namespace detail

// Reports a module's output to the active hooks (innermost scope first) and returns what they
// make of it; without a hook, the output itself.
inline at::Tensor tap(const std::string& module, const at::Tensor& input, at::Tensor output) {
  if (!detail::any_forward_hook_active()) return output;
  return detail::run_forward_hooks(module, input, std::move(output));
}

// module->forward(input), tapped.
template <class ModuleHolder>
at::Tensor call(const std::string& module, ModuleHolder& m, const at::Tensor& input) {
  return tap(module, input, m->forward(input));
}

// Makes `hook` active on this thread for the scope's lifetime. Scopes nest: the innermost
// hook sees an output first, so a fault injected inside a locator's scope is what it records.
class ForwardHookScope {
 public:
  explicit ForwardHookScope(ForwardHook* hook);
  ~ForwardHookScope();
  ForwardHookScope(const ForwardHookScope&) = delete;
  ForwardHookScope& operator=(const ForwardHookScope&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace ampkit
