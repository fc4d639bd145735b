// The TORCH_LIBRARY of `import ampkit`: torch.classes.ampkit.ScalerCore and a few free functions.
#include <torch/library.h>

#include "ampkit/plugin_call.h"
#include "errors.h"
#include "locator.h"
#include "scaler_core.h"

namespace ampkit::python {

LastError& last_error() {
  thread_local LastError error;
  return error;
}

namespace {
// Read once: the record is cleared, so a later failure that did not pass through guarded()
// (torch's own argument checks) is never mistaken for it.
std::tuple<int64_t, std::string> last_error_op() {
  LastError e = std::move(last_error());
  last_error() = LastError{};
  return {e.kind, e.message};
}
// A crash, exit() or abort inside a plugin call ends the interpreter with one line naming the
// plugin and the call, and exit code 3 (ampkit-train's for plugin errors); other crashes go to
// the handlers Python had (faulthandler's, say). SIGALRM stays Python's: no time limits.
void install_fault_reporter() {
  install_plugin_fault_reporter("ampkit", 3, false);
}

}  // namespace

}  // namespace ampkit::python

TORCH_LIBRARY(ampkit, m) {
  using ampkit::python::ScalerCore;
  m.class_<ScalerCore>("ScalerCore")
      .def(torch::init<c10::Dict<std::string, std::string>, c10::Dict<std::string, std::string>, std::string,
                       std::vector<std::string>, bool, bool, int64_t, int64_t>())
      .def("scale", &ScalerCore::scale)
      .def("unscale", &ScalerCore::unscale)
      .def("update", &ScalerCore::update)
      .def("set_scale", &ScalerCore::set_scale)
      .def("option", &ScalerCore::option)
      .def("set_option", &ScalerCore::set_option)
      .def("settings", &ScalerCore::settings)
      .def("plugin", &ScalerCore::plugin)
      .def("state", &ScalerCore::state)
      .def("load_state", &ScalerCore::load_state)
      .def("record", &ScalerCore::record)
      .def("steps_in_iteration", &ScalerCore::steps_in_iteration);
  m.class_<ampkit::python::LocatorSession>("LocatorSession")
      .def(torch::init<>())
      .def("observe", &ampkit::python::LocatorSession::observe)
      .def("finish", &ampkit::python::LocatorSession::finish);
  m.def("last_error", &ampkit::python::last_error_op);
  m.def("install_fault_reporter", &ampkit::python::install_fault_reporter);
  m.def("list_plugins", &ampkit::python::list_plugins);
  m.def("plugin_options", &ampkit::python::plugin_options);
}
