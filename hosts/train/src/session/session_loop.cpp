// The per-step host loop, numbered as docs/architecture.md's "One host step".
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "ampkit/error.h"
#include "ampkit/forward_hook.h"
#include "ampkit/outcome_record.h"
#include "session/checkpoints.h"
#include "session/nan_reports.h"
#include "session/precision_checks.h"
#include "session/rank_sync.h"
#include "session/session.h"
#include "session/stop_signals.h"

namespace ampkit::train {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void Session::train() {
  CommBackend& comm = strategies_->comm();
  const int world = comm.world_size();
  progress_ =
      std::make_unique<ProgressLine>(total_steps_, cfg_.log_every, cfg_.progress != "never" && is_root_);
  samples_per_step_ = static_cast<double>(cfg_.batch_size * cfg_.accumulate * world);
  train_start_ = std::chrono::steady_clock::now();
  if (world > 1)  // sent with each step's loss, in its gradient buckets (Trainer::set_rank_values)
    trainer_->set_rank_values([this, world] {
      const double now = seconds_since(train_start_);
      const double sps = samples_per_step_ / world / std::max(now - last_exchange_, 1e-9);
      last_exchange_ = now;
      return step_rank_values(stop_signal(), sps);
    });
  for (int64_t step = trainer_->steps_attempted(); step < total_steps_; ++step) {
    if ((world > 1 ? agreed_stop_ : stop_signal()) != 0) break;  // 1. a stop signal, agreed by all ranks
    const int64_t data_step = step + state_.data_skip;           // 2. the data this step trains on
    if (data_step / steps_per_epoch_ != epoch_) {
      epoch_ = data_step / steps_per_epoch_;
      workload_->start_epoch(epoch_);
    }
    const int64_t first_batch = (data_step % steps_per_epoch_) * cfg_.accumulate;
    nan_reports_->before_step((first_batch + cfg_.accumulate) % workload_->batches_per_epoch());
    const StepOutcome out = run_step(step, first_batch);  // 3. Trainer::step, faults planted
    update_host_state(step, out);                         // 4. rollback data skip, snapshots, counters
    const double now = seconds_since(train_start_);
    const double sps = samples_per_step_ / std::max(now - last_time_, 1e-9);
    last_time_ = now;
    const StepRecord record = step_metrics(step, data_step, out, sps, now);  // 5. agreed across ranks
    metrics_->write(record);
    layer_norms_->write(out.stats.step, names_, out.stats.tensor_norms);
    if (layer_norms_->enabled())
      tensorboard_->write_step(record, names_, out.stats.tensor_norms);
    else
      tensorboard_->write_step(record);
    progress_->update(step + 1, record);
    if (out.decision.action == NanAction::abort) {  // 6. abort, or 7. a periodic checkpoint
      abort_reason_ = out.decision.reason;
      aborted_by_scaler_ = out.aborted_by_scaler;
      break;
    }
    checkpoints_->after_step();
  }
  progress_->finish();
  if (agreed_stop_ != 0) adopt_stop_signal(agreed_stop_);  // another rank was signalled
}

StepOutcome Session::run_step(int64_t step, int64_t first_batch) {
  FaultInjector& injector = *injector_;
  const bool faulty = injector.arm(step, strategies_->comm().rank());
  StepOutcome out;
  try {
    out = trainer_->step([&](int micro) {
      ForwardHookScope scope(faulty ? &injector : nullptr);
      const at::Tensor loss = workload_->loss(first_batch + micro);
      return faulty ? injector.apply_to_loss(loss) : loss;
    });
  } catch (const Error&) {
    throw;
  } catch (const c10::DistError&) {  // a lost rank, whatever the step was doing
    throw;
  } catch (const std::exception& e) {  // the workload's model, where it is to blame (backward)
    if (std::optional<Error> own = workload_->model_failure(e)) throw *own;
    throw;
  }
  if (faulty)
    for (const Fault& f : injector.unreached())
      throw Error(ErrorCategory::usage, "--inject '" + f.spec + "': layer '" + f.layer +
                                            "' never produced an output in " + cfg_.workload + "'s forward");
  return out;
}

void Session::update_host_state(int64_t step, const StepOutcome& out) {
  if (out.decision.action == NanAction::rollback) {
    state_.data_skip += out.decision.skip_batches;
    std::fprintf(stderr, "ampkit-train: step %lld: rolled back to the %s; skipping %lld batches\n",
                 static_cast<long long>(step), rollbacks_->source().c_str(),
                 static_cast<long long>(out.decision.skip_batches));
  }
  rollbacks_->after_step(out);
  if (out.stats.found_inf) ++state_.nan_events;
  if (report_underflow_ && step == 0 && !out.stats.found_inf) {
    warnings_.push_back(underflow_warning(out.stats.zero_fraction));
    std::fprintf(stderr, "ampkit-train: warning: %s\n", warnings_.back().c_str());
  }
  if (out.stepped && out.clip_coefficient < 1.0) ++state_.clipped_steps;
  // Only applied steps: a skipped spike's loss says nothing about the model being trained.
  if (out.stepped && std::isfinite(out.stats.loss)) {
    state_.recent_losses.push_back(out.stats.loss);
    if (state_.recent_losses.size() > 20) state_.recent_losses.pop_front();
  }
}

StepRecord Session::step_metrics(int64_t step, int64_t data_step, const StepOutcome& out, double sps,
                                 double now) {
  StepRecord record = step_record(out, epoch_, trainer_->steps_skipped(), sps, now);
  if (strategies_->comm().world_size() > 1) {
    const RankStep ranks = read_step_rank_values(out.rank_values);
    record.rank_samples_per_second = ranks.samples_per_second;
    if (ranks.stop_signal != 0) agreed_stop_ = ranks.stop_signal;
    if (cfg_.check_ranks) check_same_decision(strategies_->comm(), device_, step, out);
  }
  record.data_step = data_step;
  record.steps_discarded = trainer_->steps_discarded();
  record.rollbacks = trainer_->rollbacks();
  record.located = nan_reports_->located();
  if (cfg_.layer_norms_top_k > 0)
    record.top_layers = top_layers(names_, out.stats.tensor_norms, cfg_.layer_norms_top_k);
  return record;
}

}  // namespace ampkit::train
