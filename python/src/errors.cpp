// The record of the last failure on this thread, and the words for a throw of anything else.
#include "errors.h"

namespace ampkit::python {

LastError& last_error() {
  thread_local LastError error;
  return error;
}

LastError non_standard_exception() {
  const UnwoundPluginCall call = unwound_plugin_call();
  if (!call.plugin.empty())
    return {static_cast<int64_t>(ErrorCategory::plugin),
            call.plugin + " threw something that is not a std::exception in " + call.call};
  return {static_cast<int64_t>(ErrorCategory::internal),
          "ampkit threw something that is not a std::exception, outside any plugin call (a bug in ampkit: "
          "please report it)"};
}

}  // namespace ampkit::python
