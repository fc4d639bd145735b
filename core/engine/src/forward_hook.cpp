// The thread's stack of active hooks (see forward_hook.h).
#include "ampkit/forward_hook.h"

#include <vector>

namespace ampkit {

namespace {
thread_local std::vector<ForwardHook*> t_hooks;
}

namespace detail {
bool any_forward_hook_active() {
  return !t_hooks.empty();
}

at::Tensor run_forward_hooks(const std::string& module, const at::Tensor& input, at::Tensor output) {
  for (auto it = t_hooks.rbegin(); it != t_hooks.rend(); ++it)
    output = (*it)->on_output(module, input, output);
  return output;
}
}  // namespace detail

ForwardHookScope::ForwardHookScope(ForwardHook* hook) {
  if (hook == nullptr) return;
  t_hooks.push_back(hook);
  pushed_ = true;
}

ForwardHookScope::~ForwardHookScope() {
  if (pushed_) t_hooks.pop_back();
}

}  // namespace ampkit
