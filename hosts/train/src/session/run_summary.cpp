// The run summary (run_summary.h: --summary JSON, the table on stdout) and the run's exit status.
#include "session/run_summary.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "ampkit/exit_codes.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "session/checkpoints.h"
#include "session/nan_reports.h"
#include "session/rank_sync.h"
#include "session/session.h"
#include "session/stop_signals.h"

namespace ampkit::train {

nlohmann::json RunSummary::to_json() const {
  nlohmann::json s;
  s["status"] = status;
  if (!abort_reason.empty()) s["abort_reason"] = abort_reason;
  if (!interrupted_by.empty()) s["interrupted_by"] = interrupted_by;
  if (!resumed_from.empty()) s["resumed_from"] = resumed_from;
  if (!checkpoint.empty()) s["checkpoint"] = checkpoint;
  s["workload"] = workload;
  s["precision"] = precision;
  for (const auto& [kind, p] : plugins) s["plugins"][kind] = {{"name", p.name}, {"version", p.version}};
  s["steps"] = steps;
  s["steps_taken"] = steps_taken;
  s["skipped_steps"] = skipped_steps;
  s["steps_discarded"] = steps_discarded;
  s["rollbacks"] = rollbacks;
  s["restarts"] = restarts;
  s["aborted"] = aborted;
  s["nan_reports"] = nan_reports;
  s["nan_events"] = nan_events;
  s["clip_rate"] = clip_rate;
  s["final_loss"] = std::isfinite(final_loss) ? nlohmann::json(final_loss) : nlohmann::json("nan");
  if (test_loss) s["test_loss"] = *test_loss;
  if (test_accuracy) s["test_accuracy"] = *test_accuracy;
  if (test_perplexity) s["test_perplexity"] = *test_perplexity;
  s["samples_per_second"] = samples_per_second;
  s["wall_seconds"] = wall_seconds;
  s["param_sha256"] = param_sha256;
  if (world_size) {
    s["world_size"] = *world_size;
    s["param_sha256_ranks"] = param_sha256_ranks;
    s["ranks_identical"] = ranks_identical;
    s["rank_samples_per_second"] = rank_samples_per_second;
  }
  s["located_by"] = located_by;
  s["warnings"] = warnings;
  s["step"] = {{"stats_recipe", stats_recipe},
               {"host_sync", host_sync},
               {"host_sync_reason", host_sync_reason},
               {"host_reads", host_reads}};
  return s;
}

RunSummary Session::summary(double train_seconds) const {
  const Trainer& t = *trainer_;
  const int stop = stop_;
  RunSummary s;
  s.status = !abort_reason_.empty() ? "aborted" : stop != 0 ? "interrupted" : "completed";
  s.abort_reason = abort_reason_;
  if (stop != 0 && abort_reason_.empty()) s.interrupted_by = signal_name(stop);
  s.resumed_from = resumed_from_;
  s.checkpoint = checkpoints_->last();
  s.workload = cfg_.workload;
  s.precision = to_string(cfg_.precision);
  for (const auto& p : strategies_->all())
    s.plugins[p.kind] = {p.plugin->info().name, p.plugin->info().version};
  s.steps = t.steps_attempted();
  s.steps_taken = t.steps_taken();
  s.skipped_steps = t.steps_skipped();
  s.steps_discarded = t.steps_discarded();
  s.rollbacks = t.rollbacks();
  s.restarts = cfg_.restart_count;
  s.aborted = !abort_reason_.empty();
  s.nan_reports = nan_reports_->reports();
  s.nan_events = state_.nan_events;
  s.clip_rate = t.steps_taken() ? static_cast<double>(state_.clipped_steps) / t.steps_taken() : 0.0;
  const auto& losses = state_.recent_losses;
  s.final_loss = losses.empty() ? std::numeric_limits<double>::quiet_NaN()
                                : std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size();
  std::string eval_warning;
  if (is_root_ && abort_reason_.empty() && stop == 0) {  // a preempted run has no time to evaluate
    if (auto eval = workload_->evaluate(cfg_.eval_batches)) {
      if (!std::isfinite(eval->loss)) {  // a null in the summary would say nothing: one warning line
        eval_warning =
            std::string("test_loss is ") + (std::isnan(eval->loss) ? "NaN" : "infinite") +
            ": the evaluation's loss is not finite (non-finite inputs or targets in the test data, "
            "or a model whose output is not finite)";
        std::fprintf(stderr, "ampkit-train: warning: %s\n", eval_warning.c_str());
      }
      s.test_loss = eval->loss;
      s.test_accuracy = eval->accuracy;
      s.test_perplexity = eval->perplexity;
    }
  }
  s.samples_per_second =
      train_seconds > 0 ? samples_per_step_ * (t.steps_attempted() - first_step_) / train_seconds : 0.0;
  s.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  s.param_sha256 = parameter_sha256(params_);
  if (strategies_->comm().world_size() > 1) add_rank_summaries(strategies_->comm(), device_, s);
  // After the gather: the report that located a fault leads, whichever rank wrote it.
  order_nan_reports(s.nan_reports);
  s.located_by = first_fault_located_by(s.nan_reports);
  s.warnings = warnings_;
  if (!eval_warning.empty()) s.warnings.push_back(eval_warning);
  s.stats_recipe = to_string(t.stats_recipe());
  s.host_sync = host_sync_;
  s.host_sync_reason = host_sync_reason_;
  s.host_reads = ampkit::host_reads();
  for (const auto& w : checkpoints_->warnings()) s.warnings.push_back(w);
  return s;
}

int Session::finish(double train_seconds) {
  const RunSummary s = summary(train_seconds);
  const nlohmann::json json = s.to_json();
  if (is_root_ && !cfg_.summary_file.empty()) write_json_file(cfg_.summary_file, json);
  std::vector<std::pair<std::string, double>> test;
  if (s.test_loss) test.emplace_back("eval/test_loss", *s.test_loss);
  if (s.test_accuracy) test.emplace_back("eval/test_accuracy", *s.test_accuracy);
  if (s.test_perplexity) test.emplace_back("eval/test_perplexity", *s.test_perplexity);
  if (!test.empty()) tensorboard_->write(trainer_->steps_attempted(), test);
  if (is_root_) print_summary_table(stdout, json);
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
