// The step record of a disabled ampkit.GradScaler (enabled=False, or "cuda" without a GPU), whose
// step() is the optimizer's own: the record's keys are the engine's, so a loop that reads
// last_step["reason"] after a step runs unchanged with the scaler off.
#include <ATen/core/Dict.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>

#include "ampkit/outcome_record.h"
#include "ivalues.h"

namespace ampkit::python {

namespace {

// The last of `steps` steps taken at scale 1 (none: the record before a first step), with nothing
// measured: the figures no statistics pass computed are NaN, nothing was found, clipped or skipped.
c10::Dict<std::string, c10::IValue> passthrough_record(int64_t steps) {
  const double unmeasured = std::numeric_limits<double>::quiet_NaN();
  StepOutcome o;
  o.stats.step = steps > 0 ? steps - 1 : 0;
  o.stats.loss = unmeasured;
  o.stats.grad_norm = unmeasured;
  o.stats.grad_max_abs = unmeasured;
  o.stats.zero_fraction = unmeasured;
  o.grad_norm_clipped = unmeasured;
  o.stepped = steps > 0;
  const StepRecord record = step_record(o, 0, 0, 0.0, 0.0);
  c10::Dict<std::string, c10::IValue> r = any_dict();
  record.visit([&](const char* key, const auto& value) { r.insert(key, record_value(value)); },
               /*host_fields=*/false);
  if (!r.contains("reason")) r.insert("reason", std::string());  // as ScalerCore::record() gives it
  r.insert("layer_norms", c10::IValue(any_dict()));
  r.insert("stats_recipe", std::string());  // no statistics ran
  return r;
}

}  // namespace

}  // namespace ampkit::python

TORCH_LIBRARY_FRAGMENT(ampkit, m) {
  m.def("passthrough_record", &ampkit::python::passthrough_record);
}
