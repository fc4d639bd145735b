// The NaN locator's reports and their one-line summaries.
#include "session/nan_reports.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "ampkit/checkpoint.h"
#include "ampkit/error.h"
#include "ampkit/nan_locator.h"
#include "ampkit/nan_report.h"

namespace ampkit::train {

std::filesystem::path nan_report_dir(const TrainConfig& cfg) {
  if (!cfg.nan_report_dir.empty()) return cfg.nan_report_dir;
  for (const std::string& f : {cfg.summary_file, cfg.metrics_file})
    if (!f.empty())
      return std::filesystem::path(f).parent_path().empty() ? "." : std::filesystem::path(f).parent_path();
  return ".";
}

void order_nan_reports(nlohmann::json& reports) {
  // Gathered rank by rank, rank 0's "not located" came first and hid the rank that found the layer.
  const auto key = [](const nlohmann::json& r) {
    return std::make_tuple(r.value("step", int64_t{0}), !r.value("located", false), r.value("rank", 0));
  };
  std::stable_sort(reports.begin(), reports.end(),
                   [&](const nlohmann::json& a, const nlohmann::json& b) { return key(a) < key(b); });
}

nlohmann::json first_fault_located_by(const nlohmann::json& reports) {
  if (reports.empty() || !reports[0].value("located", false)) return nullptr;
  return reports[0].value("rank", 0);
}

NanReporter::NanReporter(SessionObjects& run, Workload& workload, int rank)
    : run_(run), workload_(workload), rank_(rank) {
  run_.trainer.set_bad_step_observer(
      [this](const StepOutcome& o, const std::function<at::Tensor(int)>& forward) {
        return observe(o, forward);
      });
}

void NanReporter::before_step(int64_t step, int64_t reference_batch) {
  Entry e;
  e.step = step;
  e.reference_batch = reference_batch;
  if (run_.cfg.nan_locate > run_.state.locator_runs) e.rng = cpu_rng_state();
  steps_.push_back(std::move(e));
}

NanReporter::Entry& NanReporter::entry(int64_t step) {
  for (Entry& e : steps_)
    if (e.step == step) return e;
  throw Error(ErrorCategory::internal, "NaN reporter: no entry for step " + std::to_string(step));
}

nlohmann::json NanReporter::located(int64_t step) {
  while (!steps_.empty() && steps_.front().step < step) steps_.pop_front();
  return !steps_.empty() && steps_.front().step == step ? steps_.front().located : nlohmann::json();
}

nlohmann::json NanReporter::report_json(const StepOutcome& o, const NanLocation& loc) const {
  NanReportStep step;
  step.step = o.stats.step;
  step.rank = rank_;
  step.detection = o.decision.reason;
  step.action = to_string(o.decision.action);
  step.loss_scale = o.stats.scale;
  step.precision = to_string(run_.cfg.precision);
  return nan_report_json(step, loc, loc.module.empty() ? "" : workload_.model().module_type(loc.module));
}

bool NanReporter::observe(const StepOutcome& o, const std::function<at::Tensor(int)>& forward) {
  if (run_.state.locator_runs >= run_.cfg.nan_locate) return false;
  ++run_.state.locator_runs;
  Entry& step = entry(o.stats.step);
  const int64_t reference_batch = step.reference_batch;
  LocatorInputs in;
  in.forward = forward;
  in.micro_batches = run_.cfg.accumulate;
  in.reference = [this, reference_batch] { return workload_.loss(reference_batch); };
  in.precision = run_.cfg.precision;
  in.scale = o.stats.scale;
  in.accumulation_steps = run_.cfg.accumulate;
  if (workload_.model().hook_points().empty()) in.parameter_names = run_.trainer.names();
  const std::string rng_after = cpu_rng_state();
  set_cpu_rng_state(step.rng);  // the same RNG state as the step itself
  const NanLocation loc = locate_fault(in, run_.params);
  set_cpu_rng_state(rng_after);
  const nlohmann::json report = report_json(o, loc);
  const std::filesystem::path dir = nan_report_dir(run_.cfg);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path file =
      dir / ("nan-report-step-" + std::to_string(o.stats.step) + "-rank-" + std::to_string(rank_) + ".json");
  write_json_file(file, report);
  step.located = {{"step", o.stats.step}, {"rank", rank_},      {"located", loc.found},
                  {"module", loc.module}, {"phase", loc.phase}, {"report", file.string()}};
  reports_.push_back(step.located);
  const std::string where =
      loc.found ? (!loc.parameter.empty() ? "at parameter '" + loc.parameter + "' (its gradient)"
                   : loc.module.empty()
                       ? "in the loss"
                       : "at module '" + loc.module + "' (" + report["module_type"].get<std::string>() +
                             ", " + loc.observation.value.dtype + ", " + loc.phase + ")")
                : "not located";
  std::fprintf(stderr, "ampkit-train: step %lld: %s; locator: %s: %s; report %s\n",
               static_cast<long long>(o.stats.step), o.decision.reason.c_str(), where.c_str(),
               loc.finding.c_str(), file.string().c_str());
  return true;
}

}  // namespace ampkit::train
