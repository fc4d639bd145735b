// The per-step host loop, numbered as docs/architecture.md's "One host step".
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <optional>

#include "ampkit/checkpoint.h"
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
  if (trainer_->deferred())
    train_deferred();
  else
    for (int64_t step = trainer_->steps_attempted(); step < total_steps_; ++step) {
      if ((world > 1 ? agreed_stop_ : stop_signal()) != 0) break;  // 1. a stop signal, agreed by all ranks
      const StepPlace at = place_step(step);                       // 2. the data this step trains on
      const StepOutcome out = run_step(step, at.first_batch);      // 3. Trainer::step, faults planted
      if (record_step(at, out)) break;                             // 4-7
    }
  progress_->finish();
  if (agreed_stop_ != 0) adopt_stop_signal(agreed_stop_);  // another rank was signalled
}

// The deferred step (Trainer::deferred_backward): each step's record arrives while the next
// step's backward runs, and is handled then, before that step's update, so the parameters,
// optimizer and strategies a checkpoint after it saves are that step's; the last record, and the
// one pending at a stop, are settled after the loop. Metrics, summary and checkpoints are those
// of the synchronous loop above.
void Session::train_deferred() {
  std::deque<StepPlace> pending;  // the steps whose records have not arrived, oldest first
  bool stopped = false;
  const bool ranks = strategies_->comm().world_size() > 1;
  for (int64_t step = trainer_->steps_attempted(); step < total_steps_ && !stopped; ++step) {
    // 1. Several ranks agree through the records: a signal sent with step N stops them all after N + 1.
    if ((ranks ? agreed_stop_ : stop_signal()) != 0) break;
    pending.push_back(place_step(step));  // 2
    // A checkpoint after the previous step saves the random state this step starts from.
    const std::string rng = cpu_rng_state();
    checkpoints_->hold_rng_state(rng);
    const std::function<at::Tensor(int)> forward = step_forward(step, pending.back().first_batch);
    Trainer::DeferredBackward b = with_model_errors([&] { return trainer_->deferred_backward(forward); });
    if (b.redo) {  // the locator re-ran the previous step and took this one's gradients
      set_cpu_rng_state(rng);
      with_model_errors([&] { return trainer_->deferred_backward(forward); });
    }
    check_faults_reached();
    for (const StepOutcome& out : b.delivered) {  // 4-7 of the previous step
      stopped = record_step(pending.front(), out);
      pending.pop_front();
      if (stopped) break;  // an abort: this step never updates
    }
    if (!stopped) trainer_->deferred_update();  // 3: this step's statistics, decisions, update
  }
  if (stopped) return;  // an abort's final checkpoint keeps the held state: the last step's
  checkpoints_->hold_rng_state(std::nullopt);
  for (const StepOutcome& out : trainer_->settle()) {
    if (record_step(pending.front(), out)) break;
    pending.pop_front();
  }
}

Session::StepPlace Session::place_step(int64_t step) {
  StepPlace at;
  at.step = step;
  at.data_step = step + state_.data_skip;
  if (at.data_step / steps_per_epoch_ != epoch_) {
    epoch_ = at.data_step / steps_per_epoch_;
    workload_->start_epoch(epoch_);
  }
  at.epoch = epoch_;
  at.first_batch = (at.data_step % steps_per_epoch_) * cfg_.accumulate;
  nan_reports_->before_step(step, (at.first_batch + cfg_.accumulate) % workload_->batches_per_epoch());
  return at;
}

// Step `step`'s micro-batch function, faults planted: it arms them itself, so the locator's re-run
// of an earlier step (the deferred loop's) plants that step's.
std::function<at::Tensor(int)> Session::step_forward(int64_t step, int64_t first_batch) {
  FaultInjector* injector = injector_.get();
  const int rank = strategies_->comm().rank();
  return [this, injector, step, rank, first_batch](int micro) {
    if (micro == 0) injector->arm(step, rank);
    // The last step's fp8 scale update, before this step's first cast: one per step on every rank.
    if (micro == 0 && fp8_ != nullptr) fp8_nonfinite_ = fp8_->begin_step(strategies_->comm());
    const bool faulty = injector->armed();
    ForwardHookScope scope(faulty ? injector : nullptr);
    const at::Tensor loss = workload_->loss(first_batch + micro);
    return faulty ? injector->apply_to_loss(loss) : loss;
  };
}

template <typename Run>
auto Session::with_model_errors(Run run) -> decltype(run()) {
  try {
    return run();
  } catch (const Error&) {
    throw;
  } catch (const c10::DistError&) {  // a lost rank, whatever the step was doing
    throw;
  } catch (const std::exception& e) {  // the workload's model, where it is to blame (backward)
    if (std::optional<Error> own = workload_->model_failure(e)) throw *own;
    throw;
  }
}

void Session::check_faults_reached() const {
  if (!injector_->armed()) return;
  for (const Fault& f : injector_->unreached())
    throw Error(ErrorCategory::usage, "--inject '" + f.spec + "': layer '" + f.layer +
                                          "' never produced an output in " + cfg_.workload + "'s forward");
}

StepOutcome Session::run_step(int64_t step, int64_t first_batch) {
  const std::function<at::Tensor(int)> forward = step_forward(step, first_batch);
  const StepOutcome out = with_model_errors([&] { return trainer_->step(forward); });
  check_faults_reached();
  return out;
}

// 4-7 of "One host step" for a step's record: host state, metrics, abort, checkpoint. True: stop.
bool Session::record_step(const StepPlace& at, const StepOutcome& out) {
  update_host_state(at.step, out);  // 4. rollback data skip, snapshots, counters
  const double now = seconds_since(train_start_);
  const double sps = samples_per_step_ / std::max(now - last_time_, 1e-9);
  last_time_ = now;
  const StepRecord record = step_metrics(at, out, sps, now);  // 5. agreed across ranks
  layer_norms_->write(out.stats.step, names_, out.stats.tensor_norms);
  if (layer_norms_->enabled())
    tensorboard_->write_step(record, names_, out.stats.tensor_norms);
  else
    tensorboard_->write_step(record);
  if (fp8_ != nullptr && is_root_) {  // this step's fp8 figures, read before the next step's update
    nlohmann::json j = record.to_json();
    j["fp8"] = fp8_->step_metrics();
    j["fp8"]["nonfinite_amaxes"] = fp8_nonfinite_;
    fp8_->write_trace(at.step);
    if (tensorboard_->enabled()) tensorboard_->write(at.step, Fp8Linears::scalars(j["fp8"]));
    metrics_->write(j);
  } else {
    metrics_->write(record);
  }
  progress_->update(at.step + 1, record);
  if (out.decision.action == NanAction::abort) {  // 6. abort, or 7. a periodic checkpoint
    abort_reason_ = out.decision.reason;
    aborted_by_scaler_ = out.aborted_by_scaler;
    return true;
  }
  checkpoints_->after_step();
  return false;
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

StepRecord Session::step_metrics(const StepPlace& at, const StepOutcome& out, double sps, double now) {
  const int64_t step = at.step;
  StepRecord record = step_record(out, at.epoch, trainer_->steps_skipped(), sps, now);
  if (strategies_->comm().world_size() > 1) {
    const RankStep ranks = read_step_rank_values(out.rank_values);
    record.rank_samples_per_second = ranks.samples_per_second;
    if (ranks.stop_signal != 0) agreed_stop_ = ranks.stop_signal;
    if (cfg_.check_ranks) check_same_decision(strategies_->comm(), device_, step, out);
    if (cfg_.check_ranks && fp8_ != nullptr && !fp8_->current_scaling())
      check_same_fp8_scales(strategies_->comm(), device_, step, fp8_->scales());
  }
  record.data_step = at.data_step;
  record.steps_discarded = trainer_->steps_discarded();
  record.rollbacks = trainer_->rollbacks();
  record.located = nan_reports_->located(step);
  if (cfg_.layer_norms_top_k > 0)
    record.top_layers = top_layers(names_, out.stats.tensor_norms, cfg_.layer_norms_top_k);
  return record;
}

}  // namespace ampkit::train
