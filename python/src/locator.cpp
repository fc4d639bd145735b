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

c10::Dict<std::string, c10::IValue> LocatorSession::finish(double loss) {
  return guarded([&] {
    const NanLocation loc = recording_->finish(loss);
    c10::Dict<std::string, c10::IValue> r = str_any_dict();
    r.insert("located", loc.found);
    r.insert("module", loc.module);
    r.insert("phase", loc.phase);
    r.insert("finding", loc.finding);
    r.insert("micro_batch", static_cast<int64_t>(loc.micro_batch));
    r.insert("micro_batch_loss",
             std::isfinite(loc.loss) ? c10::IValue(loc.loss) : c10::IValue(std::string("nan")));
    if (!loc.module.empty()) r.insert("observation", observation(loc.observation));
    r.insert("forward", observations(loc.forward));
    r.insert("backward", observations(loc.backward));
    return r;
  });
}

}  // namespace ampkit::python
