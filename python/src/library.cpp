// The TORCH_LIBRARY of `import ampkit`: torch.classes.ampkit.ScalerCore and a few free functions.
#include <torch/library.h>

#include "ampkit/deepspeed_config.h"
#include "ampkit/device_waits.h"
#include "ampkit/exit_codes.h"
#include "ampkit/host_reads.h"
#include "ampkit/plugin_call.h"
#include "errors.h"
#include "locator.h"
#include "plugin_listing.h"
#include "scaler_core.h"

namespace ampkit::python {

namespace {
// Read once: the record is cleared, so a later failure that did not pass through guarded()
// (torch's own argument checks) is never mistaken for it.
std::tuple<int64_t, std::string> last_error_op() {
  LastError e = std::move(last_error());
  last_error() = LastError{};
  return {e.kind, e.message};
}
// map_deepspeed_config for ampkit.GradScaler.from_deepspeed_config, by `version`'s rules (empty:
// the config's own key, else the latest): (precision, kind -> plugin, "KIND.OPTION" -> value text,
// micro batch size or -1, accumulation steps or -1, unmapped keys).
std::tuple<std::string, c10::Dict<std::string, std::string>, c10::Dict<std::string, std::string>, int64_t,
           int64_t, std::vector<std::string>>
deepspeed_mapping(const std::string& json_text, const std::string& where, const std::string& version) {
  return guarded([&] {
    const DeepSpeedMapping m = map_deepspeed_config(
        json_text, where, version.empty() ? std::nullopt : std::optional(parse_deepspeed_version(version)));
    c10::Dict<std::string, std::string> plugins, options;
    for (const auto& [kind, name] : m.plugins) plugins.insert(kind, name);
    for (const auto& [kind, values] : m.options)
      for (const auto& [name, value] : values) options.insert(kind + "." + name, value);
    return std::make_tuple(std::string(to_string(m.precision)), plugins, options,
                           m.micro_batch_size.value_or(-1), m.accumulation_steps.value_or(-1), m.unmapped);
  });
}

// A crash, exit(), _exit() or abort inside a plugin call, or a crash or exit in a plugin's own
// thread, ends the interpreter with one line naming the plugin (and the call), and ampkit-train's
// exit code for plugin errors; other crashes go to the handlers Python had (faulthandler's, say).
// The watchdog thread (not SIGALRM, which stays Python's) ends a call past its GradScaler's
// plugin_timeout the same way; without one, no limit.
void install_fault_reporter() {
  install_plugin_fault_reporter("ampkit", exit_status(ExitCode::plugin), true);
}

}  // namespace

}  // namespace ampkit::python

TORCH_LIBRARY(ampkit, m) {
  using ampkit::python::ScalerCore;
  m.class_<ScalerCore>("ScalerCore")
      .def(torch::init<c10::Dict<std::string, std::string>, c10::Dict<std::string, std::string>, std::string,
                       std::vector<std::string>, bool, bool, int64_t, int64_t, std::string, int64_t>())
      .def("scale", &ScalerCore::scale)
      .def("bind", &ScalerCore::bind)
      .def("reduce_across", &ScalerCore::reduce_across)
      .def("set_gradients", &ScalerCore::set_gradients)
      .def("unscale", &ScalerCore::unscale)
      .def("prepare_deferred", &ScalerCore::prepare_deferred)
      .def("unscale_deferred", &ScalerCore::unscale_deferred)
      .def("device_scale", &ScalerCore::device_scale)
      .def("deliver", &ScalerCore::deliver)
      .def("end_deferred_iteration", &ScalerCore::end_deferred_iteration)
      .def("settle_iteration", &ScalerCore::settle_iteration)
      .def("set_late_arrivals", &ScalerCore::set_late_arrivals)
      .def("unbind", &ScalerCore::unbind)
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
      .def("finish", &ampkit::python::LocatorSession::finish)
      .def("report", &ampkit::python::LocatorSession::report);
  m.def("last_error", &ampkit::python::last_error_op);
  m.def("install_fault_reporter", &ampkit::python::install_fault_reporter);
  // Device-to-host reads the engine made in this process (ampkit/host_reads.h): tests count them.
  m.def("host_reads", [] { return ampkit::host_reads(); });
  // Waits for a whole device (ampkit/device_waits.h), counted on the CPU too: tests count them.
  m.def("device_waits", [] { return ampkit::device_waits(); });
  m.def("deepspeed_mapping", &ampkit::python::deepspeed_mapping);
  m.def("list_plugins", &ampkit::python::list_plugins);
  m.def("plugin_options", &ampkit::python::plugin_options);
}
