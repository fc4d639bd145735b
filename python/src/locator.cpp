// The NaN locator for Python modules (docs/python.md, "Finding the first bad layer").
#include "locator.h"

#include <ATen/core/List.h>

#include <cmath>

#include "ampkit/forward_hook.h"
#include "errors.h"

namespace ampkit::python {

namespace {

c10::Dict<std::string, c10::IValue> str_any_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

c10::IValue summary(const TensorSummary& t) {
  c10::Dict<std::string, c10::IValue> d = str_any_dict();
  d.insert("dtype", t.dtype);
  d.insert("shape", c10::List<int64_t>(t.shape));
  d.insert("min", t.min);
  d.insert("max", t.max);
  d.insert("absmax", t.absmax);
  d.insert("nonfinite", t.nonfinite);
  return d;
}

// One observation as ampkit-train's report writes it (hosts/train/src/session/nan_reports.cpp).
c10::IValue observation(const ModuleObservation& o) {
  c10::Dict<std::string, c10::IValue> d = str_any_dict();
  d.insert("module", o.module);
  d.insert("phase", o.phase);
  d.insert(o.phase == "forward" ? "output" : "gradient", summary(o.value));
  if (!o.input.dtype.empty()) d.insert("input", summary(o.input));
  return d;
}

c10::IValue observations(const std::vector<ModuleObservation>& seen) {
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto& o : seen) list.push_back(observation(o));
  return list;
}

}  // namespace

LocatorSession::LocatorSession() {
  guarded([&] { recording_ = std::make_unique<LocatorRecording>(); });
}

void LocatorSession::observe(const std::string& module, std::optional<at::Tensor> input, at::Tensor output) {
  guarded([&] { tap(module, input ? *input : at::Tensor(), std::move(output)); });
}

void LocatorSession::add_findings(c10::Dict<std::string, c10::IValue>& r, double loss,
                                  const c10::Dict<std::string, std::string>& module_types) {
  const NanLocation loc = recording_->finish(loss);
  r.insert("located", loc.found);
  r.insert("module", loc.module);
  const auto type = loc.module.empty() ? module_types.end() : module_types.find(loc.module);
  r.insert("module_type", type == module_types.end() ? std::string() : type->value());
  r.insert("phase", loc.phase);
  r.insert("finding", loc.finding);
  r.insert("micro_batch", static_cast<int64_t>(loc.micro_batch));
  r.insert("micro_batch_loss",
           std::isfinite(loc.loss) ? c10::IValue(loc.loss) : c10::IValue(std::string("nan")));
  if (!loc.module.empty()) r.insert("observation", observation(loc.observation));
  r.insert("forward", observations(loc.forward));
  r.insert("backward", observations(loc.backward));
}

c10::Dict<std::string, c10::IValue> LocatorSession::finish(double loss,
                                                           c10::Dict<std::string, std::string> module_types) {
  return guarded([&] {
    c10::Dict<std::string, c10::IValue> r = str_any_dict();
    add_findings(r, loss, module_types);
    return r;
  });
}

c10::Dict<std::string, c10::IValue> LocatorSession::report(double loss,
                                                           c10::Dict<std::string, std::string> module_types,
                                                           int64_t step, int64_t rank, std::string detection,
                                                           std::string action, double loss_scale,
                                                           std::string precision) {
  return guarded([&] {
    c10::Dict<std::string, c10::IValue> r = str_any_dict();
    r.insert("step", step);
    r.insert("rank", rank);
    r.insert("detection", detection);
    r.insert("action", action);
    r.insert("loss_scale", loss_scale);
    r.insert("precision", precision);
    add_findings(r, loss, module_types);
    return r;
  });
}

}  // namespace ampkit::python
