// The tables the Python layer reads at import (ampkit/_facts.py), each from its one C++
// declaration: kinds (kinds.h, kStepKinds), precisions (step.h), error categories (error.h's enum, and
// errors.h's kAborted), the autocast dtype of each precision (autocast_guard.h), the declared
// per-precision defaults of plugin options and a clipper's threshold option (plugin_listing.h), and
// the nan_policy plugins and options the seeds' NaN strategies name.
#include "facts.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ampkit/autocast_guard.h"
#include "ampkit/error.h"
#include "ampkit/kinds.h"
#include "ampkit/nan_detector.h"
#include "errors.h"
#include "ivalues.h"
#include "plugin_listing.h"

namespace ampkit::python {

namespace {

std::string step_kind_names() {
  std::string out;
  for (const char* k : kStepKinds) out += (out.empty() ? "" : ", ") + std::string(k);
  return out;
}

std::vector<std::string> step_kinds() {
  std::vector<std::string> out;
  for (const KindInfo& k : kKinds)  // kinds.h's order
    for (const char* step_kind : kStepKinds)
      if (std::string(k.name) == step_kind) out.emplace_back(k.name);
  return out;
}

std::vector<std::string> precisions() {
  std::vector<std::string> out;
  for (const Precision p : kPrecisions) out.emplace_back(to_string(p));
  return out;
}

// The enumerator's name of every ErrorCategory value (-Wswitch names one left out), nullptr past the
// last one.
const char* category_name(ErrorCategory c) {
  switch (c) {
    case ErrorCategory::internal:
      return "internal";
    case ErrorCategory::usage:
      return "usage";
    case ErrorCategory::plugin:
      return "plugin";
    case ErrorCategory::data:
      return "data";
    case ErrorCategory::checkpoint:
      return "checkpoint";
    case ErrorCategory::distributed:
      return "distributed";
    case ErrorCategory::output:
      return "output";
  }
  return nullptr;
}

// (name, value) of every ErrorCategory, then ("aborted", kAborted): what last_error() reports.
std::vector<std::tuple<std::string, int64_t>> error_categories() {
  std::vector<std::tuple<std::string, int64_t>> out;
  for (int64_t value = 0; const char* name = category_name(static_cast<ErrorCategory>(value)); ++value)
    out.emplace_back(name, value);
  out.emplace_back("aborted", kAborted);
  return out;
}

// The seeds' NaN strategies (ampkit.seeds.NaNRecoveryManager): (strategy, its nan_policy plugin, the
// options it sets). "clip" applies a finite spike clipped, which needs spike detection on: at the
// detector's cautious z-score unless the caller gives one.
std::vector<std::tuple<std::string, std::string, c10::Dict<std::string, c10::IValue>>>
seeds_nan_strategies() {
  using Options = std::initializer_list<std::pair<const char*, c10::IValue>>;
  std::vector<std::tuple<std::string, std::string, c10::Dict<std::string, c10::IValue>>> out;
  const auto add = [&out](const char* strategy, const char* policy, Options options) {
    c10::Dict<std::string, c10::IValue> values = any_dict();
    for (const auto& [name, value] : options) values.insert(name, value);
    out.emplace_back(strategy, policy, values);
  };
  add("skip", "skip", {});
  add("reduce_scale", "backoff", {});
  add("clip", "skip",
      {{"on_spike", std::string("clip")}, {"spike_zscore", double{AMPKIT_CAUTIOUS_SPIKE_ZSCORE}}});
  add("abort", "abort", {});
  return out;
}

// An empty tensor of the dtype autocast runs `precision` in (a ScalarType crosses to Python as a
// bare int; a tensor carries it as torch.dtype), None for fp32.
std::optional<at::Tensor> autocast_dtype_of(const std::string& precision) {
  return guarded([&]() -> std::optional<at::Tensor> {
    const std::optional<c10::ScalarType> dtype = autocast_dtype(precision_from(precision));
    if (!dtype) return std::nullopt;
    return at::empty({0}, at::TensorOptions().dtype(*dtype));
  });
}

}  // namespace

void check_step_kind(const std::string& kind) {
  std::vector<std::string> names;
  for (const char* k : kStepKinds) {
    if (kind == k) return;
    names.emplace_back(k);
  }
  if (const KindInfo* known = find_kind(kind))
    throw Error(
        ErrorCategory::usage,
        "plugin kind '" + kind + "' is not used by ampkit.GradScaler: " +
            (optional_kind(*known) ? std::string("an fp8 recipe is chosen by ampkit.fp8.convert(model, "
                                                 "recipe=...) (see docs/fp8.md)")
                                   : std::string("in Python, gradients are averaged across ranks by torch "
                                                 "DDP (see docs/python.md)")));
  const std::string hint = did_you_mean(kind, names);
  throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind + "' (kinds: " + step_kind_names() + ")" +
                                        (hint.empty() ? "" : "; " + hint));
}

Precision precision_from(const std::string& text) {
  if (const std::optional<Precision> p = parse_precision(text)) return *p;
  const std::string hint = did_you_mean(text, precisions());
  throw Error(ErrorCategory::usage, "precision '" + text + "' is not one of " + precision_names(", ") +
                                        (hint.empty() ? "" : "; " + hint));
}

}  // namespace ampkit::python

TORCH_LIBRARY_FRAGMENT(ampkit, m) {
  m.def("step_kinds", &ampkit::python::step_kinds);
  m.def("precisions", &ampkit::python::precisions);
  m.def("error_categories", &ampkit::python::error_categories);
  m.def("autocast_dtype", &ampkit::python::autocast_dtype_of);
  m.def("option_defaults", &ampkit::python::option_defaults);
  m.def("threshold_option", &ampkit::python::threshold_option);
  m.def("seeds_nan_strategies", &ampkit::python::seeds_nan_strategies);
}
