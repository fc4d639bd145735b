// The NaN report's layout (nan_report.h), the one both hosts write.
#include "ampkit/nan_report.h"

#include <cmath>

namespace ampkit {

namespace {

nlohmann::json summary_json(const TensorSummary& t) {
  return {{"dtype", t.dtype}, {"shape", t.shape},   {"min", t.min},
          {"max", t.max},     {"absmax", t.absmax}, {"nonfinite", t.nonfinite}};
}

nlohmann::json observation_json(const ModuleObservation& o) {
  nlohmann::json j = {{"module", o.module}, {"phase", o.phase}};
  j[o.phase == "forward" ? "output" : "gradient"] = summary_json(o.value);
  if (!o.input.dtype.empty()) j["input"] = summary_json(o.input);
  return j;
}

nlohmann::json observations_json(const std::vector<ModuleObservation>& seen) {
  nlohmann::json list = nlohmann::json::array();
  for (const ModuleObservation& o : seen) list.push_back(observation_json(o));
  return list;
}

}  // namespace

nlohmann::json nan_findings_json(const NanLocation& loc, const std::string& module_type) {
  nlohmann::json j = {
      {"located", loc.found},
      {"module", loc.module},
      {"module_type", module_type},
      {"phase", loc.phase},
      {"finding", loc.finding},
      {"micro_batch", loc.micro_batch},
      {"micro_batch_loss", std::isfinite(loc.loss) ? nlohmann::json(loc.loss) : nlohmann::json("nan")},
      {"forward", observations_json(loc.forward)},
      {"backward", observations_json(loc.backward)}};
  if (!loc.module.empty() || !loc.parameter.empty()) j["observation"] = observation_json(loc.observation);
  if (!loc.parameter.empty()) j["parameter"] = loc.parameter;
  if (loc.reference_absmax > 0) j["reference_absmax"] = loc.reference_absmax;
  return j;
}

nlohmann::json nan_report_json(const NanReportStep& step, const NanLocation& loc,
                               const std::string& module_type) {
  nlohmann::json j = nan_findings_json(loc, module_type);
  j["step"] = step.step;
  j["rank"] = step.rank;
  j["detection"] = step.detection;
  j["action"] = step.action;
  j["loss_scale"] = step.loss_scale;
  j["precision"] = step.precision;
  return j;
}

}  // namespace ampkit
