// The NaN locator for Python modules (docs/python.md, "Finding the first bad layer").
#include "locator.h"

#include "ampkit/forward_hook.h"
#include "ampkit/nan_report.h"
#include "errors.h"
#include "ivalues.h"

namespace ampkit::python {

namespace {

// The report's layout is the engine's (nan_report.h), ampkit-train's file decoded as Python decodes it.
c10::Dict<std::string, c10::IValue> as_dict(const nlohmann::json& report) {
  return c10::impl::toTypedDict<std::string, c10::IValue>(json_ivalue(report).toGenericDict());
}

}  // namespace

LocatorSession::LocatorSession() {
  guarded([&] { recording_ = std::make_unique<LocatorRecording>(); });
}

void LocatorSession::observe(const std::string& module, std::optional<at::Tensor> input, at::Tensor output) {
  guarded([&] { tap(module, input ? *input : at::Tensor(), std::move(output)); });
}

NanLocation LocatorSession::located(double loss, const c10::Dict<std::string, std::string>& module_types,
                                    std::string& module_type) {
  NanLocation loc = recording_->finish(loss);
  const auto type = loc.module.empty() ? module_types.end() : module_types.find(loc.module);
  module_type = type == module_types.end() ? std::string() : type->value();
  return loc;
}

c10::Dict<std::string, c10::IValue> LocatorSession::finish(double loss,
                                                           c10::Dict<std::string, std::string> module_types) {
  return guarded([&] {
    std::string module_type;
    const NanLocation loc = located(loss, module_types, module_type);
    return as_dict(nan_findings_json(loc, module_type));
  });
}

c10::Dict<std::string, c10::IValue> LocatorSession::report(double loss,
                                                           c10::Dict<std::string, std::string> module_types,
                                                           int64_t step, int64_t rank, std::string detection,
                                                           std::string action, double loss_scale,
                                                           std::string precision) {
  return guarded([&] {
    std::string module_type;
    const NanLocation loc = located(loss, module_types, module_type);
    NanReportStep s;
    s.step = step;
    s.rank = rank;
    s.detection = std::move(detection);
    s.action = std::move(action);
    s.loss_scale = loss_scale;
    s.precision = std::move(precision);
    return as_dict(nan_report_json(s, loc, module_type));
  });
}

}  // namespace ampkit::python
