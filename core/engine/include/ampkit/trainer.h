// The AMP step pipeline: autocast forward, scaled backward, one stats pass, policy, one multiply
// (none with a fused optimizer that unscales in its own pass).
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/amp_step.h>
#include <ampkit/autocast_guard.h>
#include <ampkit/comm_backend.h>
#include <ampkit/data_parallel.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/gradient_table.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>
#include <ampkit/step.h>
#include <ampkit/unscaling_optimizer.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}
namespace c10d {
class Reducer;
}

namespace ampkit {

class DeferredStep;
class StepValuesCarrier;

// Learning rate as a function of the number of optimizer steps actually taken. The cosine's
// horizon is in steps taken too: a run of total_steps attempts that loses some (skipped, or
// discarded by a rollback) takes fewer, so each lost step shortens the horizon by one and the
// last step still ends at min_lr (PyTorch's loop steps its scheduler on skipped iterations
// instead; DeepSpeed does not step it and so never reaches the floor).
struct LrSchedule {
  enum class Kind { constant, cosine };
  Kind kind = Kind::constant;
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;  // linear warm-up from 0 to base_lr, in steps taken
  int64_t total_steps = 0;   // attempted steps of the run; cosine reaches min_lr at its end
  double min_lr = 0.0;
  // `steps_lost`: attempted steps so far that were not taken (horizon = total_steps - lost).
  double at(int64_t steps_taken, int64_t steps_lost = 0) const;
};

// The four strategies a Trainer calls, borrowed: whoever loaded them (a host's StrategySet, a test)
// owns them and keeps them alive longer than the Trainer.
struct TrainerStrategies {
  LossScaler* scaler = nullptr;
  GradClipper* clipper = nullptr;
  NanPolicy* nan_policy = nullptr;
  CommBackend* comm = nullptr;
};

// A Trainer's step counters: its AmpStep's (amp_step.h).
using TrainerCounters = StepCounters;

class Trainer {
 public:
  // `parameters` and `names` are the model's trainable parameters in a fixed order; the
  // optimizer must own the same tensors. The strategies must outlive the trainer.
  Trainer(Precision precision, int accumulation_steps, std::vector<at::Tensor> parameters,
          std::vector<std::string> names, torch::optim::Optimizer& optimizer, TrainerStrategies strategies,
          LrSchedule schedule);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Makes the ranks one data-parallel job (collective: every rank calls it, after loading any
  // checkpoint): checks that every rank has the same parameter shapes, sends rank 0's parameters
  // and buffers to all, and, where the comm backend has a c10d process group, attaches torch's
  // DDP Reducer: gradients are all-reduced in buckets while backward still runs, only on the
  // last micro-batch of a step. Without a process group, step() averages after backward.
  void enable_data_parallel(const DataParallelOptions& options);
  bool data_parallel() const { return reducer_ != nullptr; }

  // Calls every strategy's start(); the first step() does it if not done.
  void start(const RunInfo& extra);

  // One optimizer step over `accumulation_steps` micro-batches. `forward(i)` computes the fp32
  // loss of micro-batch i; it runs under autocast. The steps are those of docs/architecture.md.
  StepOutcome step(const std::function<at::Tensor(int micro_batch)>& forward);

  // Called on NanAction::rollback: restores the last good snapshot (parameters, buffers,
  // optimizer) and returns the number of optimizer steps that snapshot had taken, so the LR
  // schedule resumes from there. Without one a rollback decision is an error.
  void set_rollback_handler(std::function<int64_t()> handler) { rollback_ = std::move(handler); }

  // Called on every step the policy did not let through, before any recovery (backoff,
  // rollback) and while the parameters are still those the bad step ran with; `forward` is the
  // step's own micro-batch function. The NaN locator hooks in here; it returns whether it ran the
  // step's forward and backward again (which leaves no gradients behind).
  using BadStepObserver =
      std::function<bool(const StepOutcome& outcome, const std::function<at::Tensor(int)>& forward)>;
  void set_bad_step_observer(BadStepObserver observer) { bad_step_observer_ = std::move(observer); }

  // Values this rank sends every other rank each multi-rank step besides its loss (ampkit-train:
  // its stop signal and throughput; at most StepValuesCarrier::kMaxValues), asked for once per
  // step, just before the last micro-batch's backward (they ride in its gradient buckets) or,
  // without a Reducer, before the step's all_gather; every rank gives the same number of values
  // every step. StepOutcome::rank_values holds every rank's after the step. They cost no
  // collective and no host read of their own.
  void set_rank_values(std::function<std::vector<double>()> values) { rank_values_ = std::move(values); }

  // The statistics recipe (grad_stats.h), chosen once when the Trainer is built: automatic takes
  // fused_scan for fp32 CPU parameters, chunk_kernel on a GPU where this build holds it,
  // foreach_ops otherwise. Every recipe reads the host once per healthy step (host_reads.h): the
  // statistics, the loss and the ranks' packed values in one copy. Setting one builds the
  // gradient table again (tests force a GPU's recipe on CPU tensors).
  void set_stats_recipe(DeviceStatsRecipe recipe);
  DeviceStatsRecipe stats_recipe() const { return table_->recipe(); }
  // Why automatic did not take the chunk kernel for parameters on a GPU ("" when it did, or on a CPU).
  const std::string& stats_recipe_fallback() const { return table_->recipe_fallback(); }

  // Unscale and clip folded into the optimizer (step 6): where it is an UnscalingOptimizer
  // (FusedAdamW) and the clipper takes one coefficient for all gradients, the gradients are not
  // multiplied; the optimizer divides them by scale / clip_coefficient in its own pass. On by
  // default; off gives the one multiply pass every other optimizer gets (tests compare the two).
  void set_fold_unscale(bool fold) { fold_unscale_ = fold; }
  bool folds_unscale() const { return fold_unscale_ && unscaling_ != nullptr; }

  // The deferred step (deferred_step.h): no host read on a healthy step. Returns "" when
  // it is on: the optimizer takes grad_scale and found_inf on the device (FusedAdamW, folded), one
  // process or the Reducer's buckets (several ranks: after enable_data_parallel; every rank's loss
  // and values ride in them and are decoded on the device, and reach the host with the record), a
  // statistics recipe with a deferred form, and a device form for every strategy. Otherwise it
  // stays off and the reason is returned, with the kind of the strategy without a device form in
  // `kind` ("" when that is not the reason). `tensor_norms`: the records carry every gradient's
  // norm (StepStats::tensor_norms), as step()'s do. Call between steps.
  std::string enable_deferred_step(std::string& kind, bool tensor_norms);
  bool deferred() const { return deferred_ != nullptr; }
  // The deferred step itself (nullptr while it is off): its pending records, how its rules run.
  DeferredStep* deferred_step() { return deferred_.get(); }

  // One deferred step in two calls, so that the host handles the previous step's record while
  // this step's backward still runs on the device, before this step's update:
  // deferred_backward runs 1-3 (forward and backward with the device's scale), then delivers the
  // records of earlier steps (at most one step behind; waiting for them costs the device nothing,
  // its queue holds this step's backward): each goes to the host forms, the counters, the
  // optimizer's step counts and the learning rate, as step() makes them, and one that was not
  // stepped to the bad-step observer. An observer that ran that step again took this step's
  // gradients: `redo` asks the caller to call deferred_backward again for this step (from the
  // random state it started with). A delivered abort: the caller stops; this step never updates.
  struct DeferredBackward {
    std::vector<StepOutcome> delivered;
    bool redo = false;
  };
  DeferredBackward deferred_backward(const std::function<at::Tensor(int)>& forward);
  // 4-8 of this step on the device (statistics, decisions, the scale's update) and the fused
  // optimizer's step with their grad_scale and found_inf; the record follows later.
  void deferred_update();
  // Every record not yet delivered, delivered (waits for the device): before a checkpoint, after
  // a stop and at the end.
  std::vector<StepOutcome> settle();

  // Every attempted step is exactly one of: taken (its update is in the parameters), skipped
  // (a bad step, never applied) or discarded (applied, then undone by a rollback).
  int64_t steps_attempted() const { return amp_.counters().attempted; }
  int64_t steps_taken() const { return amp_.counters().taken; }
  int64_t steps_skipped() const { return amp_.counters().skipped(); }
  int64_t steps_discarded() const { return amp_.counters().discarded; }
  int64_t rollbacks() const { return amp_.counters().rollbacks; }
  int64_t consecutive_skips() const { return amp_.counters().consecutive_skips; }
  const LrSchedule& schedule() const { return schedule_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& names() const { return names_; }
  Precision precision() const { return precision_; }

  // The counters as one value, saved in a checkpoint and restored from it (exact resume);
  // restore_counters throws Error(checkpoint) for counters no run can reach.
  TrainerCounters counters() const { return amp_.counters(); }
  void restore_counters(const TrainerCounters& counters);

 private:
  // The phases of step(), numbered as docs/architecture.md's "One optimizer step".
  // `device_scale` (the deferred step's): the scale as a device tensor, `scale` unused.
  void forward_backward(const std::function<at::Tensor(int)>& forward, double scale,
                        const at::Tensor& device_scale = {});  // 1, 2
  StepOutcome delivered(StepOutcome out);
  struct DeferredPending;
  std::vector<double> ranks_delivered(const DeferredPending& step, const StepStats& stats) const;
  void average_across_ranks();  // 3
  at::Tensor rank_row();
  std::vector<double> rank_values_of(std::vector<double> packed, int ranks) const;
  void recover(const StepOutcome& out, const std::function<at::Tensor(int)>& forward);  // 5
  void take_optimizer_step(double factor);                                              // 7
  // 2 and 4-6, 8 are AmpStep's (amp_step.h), shared with the Python GradScaler.

  double scheduled_lr() const {
    const StepCounters& c = amp_.counters();
    return schedule_.at(c.taken, c.skipped() + c.discarded);
  }
  void set_lr(double lr);
  void zero_grad();

  Precision precision_;
  int accumulation_steps_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  torch::optim::Optimizer& optimizer_;
  UnscalingOptimizer* unscaling_;  // optimizer_ when it unscales in its own pass, else null
  TrainerStrategies strategies_;
  AmpStep amp_;
  LrSchedule schedule_;
  std::unique_ptr<GradientTable> table_;  // the parameters' gradients and their statistics pass
  DataParallelOptions data_parallel_;
  std::unique_ptr<c10d::Reducer> reducer_;
  std::unique_ptr<StepValuesCarrier> carrier_;  // with the Reducer: the step's values in its buckets
  std::function<int64_t()> rollback_;
  BadStepObserver bad_step_observer_;
  bool fold_unscale_ = true;
  std::function<std::vector<double>()> rank_values_;
  at::Tensor step_loss_;    // this rank's mean loss of the step, float64 on the device
  at::Tensor step_values_;  // every rank's loss and values (carrier_: encoded), read in step 4
  int64_t row_length_ = 1;  // this step's values per rank, loss included
  bool started_ = false;
  // The deferred step: its device side, and each step not yet delivered: its learning rate and
  // (several ranks) every rank's values as the buckets carried them, copied to the host behind
  // the step's work (pinned on a GPU), decoded when its record arrives.
  struct DeferredPending {
    double lr = 0;
    at::Tensor rank_values;  // undefined: one process
    int64_t row_length = 1;
  };
  std::unique_ptr<DeferredStep> deferred_;
  std::deque<DeferredPending> deferred_pending_;
  std::function<at::Tensor(int)> previous_forward_;  // the bad-step observer's, one step late
};

}  // namespace ampkit
