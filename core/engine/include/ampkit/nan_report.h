// The NaN report: what the locator found at a bad step, laid out once for ampkit-train's
// nan-report-step-N-rank-R.json and the dict Python's locator returns (docs/troubleshooting-nan.md).
#pragma once

#include <ampkit/nan_locator.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ampkit {

// The bad step a report is about.
struct NanReportStep {
  int64_t step = 0;
  int64_t rank = 0;
  std::string detection;  // the NaN policy's reason
  std::string action;     // what the policy did (to_string(NanAction))
  double loss_scale = 1;
  std::string precision;
};

// The locator's findings: located, module, module_type (the caller's name for `loc.module`'s type,
// "" for none), phase, finding, micro_batch, micro_batch_loss ("nan" when not finite), observation
// (of the module or parameter found), parameter and reference_absmax where they apply, and forward
// and backward: every module observed, in execution order (empty lists for a model without modules).
nlohmann::json nan_findings_json(const NanLocation& loc, const std::string& module_type);

// The whole report: the step's keys (step, rank, detection, action, loss_scale, precision) and the
// findings'.
nlohmann::json nan_report_json(const NanReportStep& step, const NanLocation& loc,
                               const std::string& module_type);

}  // namespace ampkit
