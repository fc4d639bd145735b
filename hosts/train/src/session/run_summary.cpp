// The run summary (--summary JSON, the table on stdout) and the run's exit status.
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "ampkit/exit_codes.h"
#include "session/checkpoints.h"
#include "session/nan_reports.h"
#include "session/rank_sync.h"
#include "session/session.h"
#include "session/stop_signals.h"

namespace ampkit::train {

nlohmann::json Session::summary(double train_seconds) const {
  const Trainer& t = *trainer_;
  const int stop = stop_;
  nlohmann::json s;
  s["status"] = !abort_reason_.empty() ? "aborted" : stop != 0 ? "interrupted" : "completed";
  if (!abort_reason_.empty()) s["abort_reason"] = abort_reason_;
  if (stop != 0 && abort_reason_.empty()) s["interrupted_by"] = signal_name(stop);
  if (!resumed_from_.empty()) s["resumed_from"] = resumed_from_;
  if (!checkpoints_->last().empty()) s["checkpoint"] = checkpoints_->last();
  s["workload"] = cfg_.workload;
  s["precision"] = to_string(cfg_.precision);
  for (const auto& p : strategies_->all())
    s["plugins"][p.kind] = {{"name", p.plugin->info().name}, {"version", p.plugin->info().version}};
  s["steps"] = t.steps_attempted();
  s["steps_taken"] = t.steps_taken();
  s["skipped_steps"] = t.steps_skipped();
  s["steps_discarded"] = t.steps_discarded();
  s["rollbacks"] = t.rollbacks();
  s["restarts"] = cfg_.restart_count;  // by the launcher (--max-restarts), before this run
  s["aborted"] = !abort_reason_.empty();
  s["nan_reports"] = nan_reports_->reports();
  s["nan_events"] = state_.nan_events;
  s["clip_rate"] = t.steps_taken() ? static_cast<double>(state_.clipped_steps) / t.steps_taken() : 0.0;
  const auto& losses = state_.recent_losses;
  s["final_loss"] = losses.empty() ? std::numeric_limits<double>::quiet_NaN()
                                   : std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size();
  if (is_root_ && abort_reason_.empty() && stop == 0) {  // a preempted run has no time to evaluate
    if (auto eval = workload_->evaluate(cfg_.eval_batches)) {
      s["test_loss"] = eval->loss;
      s["test_accuracy"] = eval->accuracy;
      if (eval->perplexity) s["test_perplexity"] = *eval->perplexity;
    }
  }
  s["samples_per_second"] =
      train_seconds > 0 ? samples_per_step_ * (t.steps_attempted() - first_step_) / train_seconds : 0.0;
  s["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  s["param_sha256"] = parameter_sha256(params_);
  if (strategies_->comm().world_size() > 1) add_rank_summaries(strategies_->comm(), device_, s);
  // After the gather: the report that located a fault leads, whichever rank wrote it.
  order_nan_reports(s["nan_reports"]);
  s["located_by"] = first_fault_located_by(s["nan_reports"]);
  s["warnings"] = warnings_;
  for (const auto& w : checkpoints_->warnings()) s["warnings"].push_back(w);
  if (s["final_loss"].is_number_float() && !std::isfinite(s["final_loss"].get<double>()))
    s["final_loss"] = "nan";
  return s;
}

int Session::finish(double train_seconds) {
  const nlohmann::json s = summary(train_seconds);
  if (is_root_ && !cfg_.summary_file.empty()) write_json_file(cfg_.summary_file, s);
  std::vector<std::pair<std::string, double>> test;
  for (const char* key : {"test_loss", "test_accuracy", "test_perplexity"})
    if (s.contains(key)) test.emplace_back(std::string("eval/") + key, s[key].get<double>());
  if (!test.empty()) tensorboard_->write(trainer_->steps_attempted(), test);
  if (is_root_) print_summary_table(stdout, s);
  strategies_->comm().barrier();  // rank 0 hosts the rendezvous store: it leaves last
  if (!abort_reason_.empty()) {
    const std::string kind = aborted_by_scaler_ ? "scaler" : "nan_policy";
    std::fprintf(stderr, "ampkit-train: training aborted by %s '%s' at step %lld: %s\n", kind.c_str(),
                 strategies_->selected(kind).plugin->info().name.c_str(),
                 static_cast<long long>(trainer_->steps_attempted() - 1), abort_reason_.c_str());
    return exit_status(ExitCode::aborted);
  }
  if (const int stop = stop_; stop != 0) {
    std::fprintf(stderr, "ampkit-train: interrupted by %s after step %lld%s\n", signal_name(stop),
                 static_cast<long long>(trainer_->steps_attempted()),
                 !cfg_.checkpoint_dir.empty() && !is_root_ ? "; rank 0 wrote the checkpoint"
                 : checkpoints_->last().empty()            ? " (no --checkpoint-dir: nothing saved)"
                                                           : "; resume with --resume auto");
    return exit_status(ExitCode::interrupted);
  }
  return 0;
}

}  // namespace ampkit::train
