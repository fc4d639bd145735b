// NaN reports: the locator re-runs a bad step with every module observed and writes
// nan-report-step-N-rank-R.json (docs/troubleshooting-nan.md); one line on stderr per report.
#pragma once

#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "ampkit/nan_locator.h"
#include "session/session.h"

namespace ampkit::train {

// The folder for NaN reports: --nan-report-dir, else that of --summary, else of --metrics, else ".".
std::filesystem::path nan_report_dir(const TrainConfig& cfg);

// Every rank's reports in the order a reader wants them: by step, a report that located the
// fault before the ranks that could not, then by rank. Stable; `reports` is the summary's array.
void order_nan_reports(nlohmann::json& reports);
// The summary's `located_by`: the rank whose report located the first fault (the earliest step
// reported), or null when no rank located it or nothing was reported. Expects ordered reports.
nlohmann::json first_fault_located_by(const nlohmann::json& reports);

class NanReporter {
 public:
  // Installs itself as the Trainer's bad-step observer; reports use `workload` for the
  // reference batch and the module types.
  NanReporter(SessionObjects& run, Workload& workload, int rank);
  // Before each step: the batch a healthy reference run uses, and the RNG state the step starts
  // from (a re-run must draw the same dropout masks). Kept per step until its record has been
  // handled (the deferred step delivers records one step late).
  void before_step(int64_t step, int64_t reference_batch);
  // Step `step`'s locator finding for its metrics record, or null; the steps before it are forgotten.
  nlohmann::json located(int64_t step);
  const nlohmann::json& reports() const { return reports_; }

 private:
  struct Entry {
    int64_t step = 0, reference_batch = 0;
    std::string rng;         // kept while the locator has runs left
    nlohmann::json located;  // the finding, or null
  };
  Entry& entry(int64_t step);
  bool observe(const StepOutcome& o, const std::function<at::Tensor(int)>& forward);
  nlohmann::json report_json(const StepOutcome& o, const NanLocation& loc) const;
  SessionObjects& run_;
  Workload& workload_;
  int rank_;
  std::deque<Entry> steps_;  // the steps whose records have not been handled, oldest first
  nlohmann::json reports_ = nlohmann::json::array();
};

}  // namespace ampkit::train
