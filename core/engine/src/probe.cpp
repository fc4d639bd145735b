// The thread's stack of active probes (see probe.h).
#include "ampkit/probe.h"

#include <vector>

namespace ampkit {

namespace {
thread_local std::vector<Probe*> t_probes;
}

namespace detail {
bool any_probe_active() {
  return !t_probes.empty();
}

at::Tensor run_probes(const std::string& module, const at::Tensor& input, at::Tensor output) {
  for (auto it = t_probes.rbegin(); it != t_probes.rend(); ++it)
    output = (*it)->on_output(module, input, output);
  return output;
}
}  // namespace detail

ProbeScope::ProbeScope(Probe* probe) {
  if (probe == nullptr) return;
  t_probes.push_back(probe);
  pushed_ = true;
}

ProbeScope::~ProbeScope() {
  if (pushed_) t_probes.pop_back();
}

}  // namespace ampkit
