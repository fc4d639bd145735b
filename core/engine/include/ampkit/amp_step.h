// The AMP step without the optimizer: what runs between the caller's backward and its step.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/gradient_table.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>
#include <ampkit/step.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ampkit {

struct StepOutcome {
  StepStats stats;
  NanDecision decision;
  bool stepped = false;           // the optimizer (and the LR schedule) stepped
  double clip_coefficient = 1.0;  // 1 when not clipped (or not stepped)
  double clip_threshold = 0.0;
  double grad_norm_clipped = 0.0;  // unscaled total norm after clipping
  double scale_next = 1.0;         // the scale after the scaler's update
  double lr = 0.0;                 // learning rate used by this step
  bool aborted_by_scaler = false;  // the abort comes from the loss scaler (its update threw)
  // Multi-rank steps: the values every rank gave Trainer::set_rank_values, rank after rank.
  std::vector<double> rank_values;
};

// The three strategies one step consults; the comm backend is the data-parallel caller's.
struct AmpStrategies {
  LossScaler* scaler = nullptr;
  GradClipper* clipper = nullptr;
  NanPolicy* nan_policy = nullptr;
};

// The counters of the steps an AmpStep ran. Every attempted step is exactly one of taken (its
// update is in the parameters), skipped (a bad step, never applied) or discarded (applied, then
// undone by a rollback), so skipped is attempted - taken - discarded.
struct StepCounters {
  int64_t attempted = 0;
  int64_t taken = 0;
  int64_t discarded = 0;
  int64_t rollbacks = 0;
  int64_t consecutive_skips = 0;  // skipped steps in a row before the next one
  int64_t skipped() const { return attempted - taken - discarded; }
};

// Values every rank sent with its gradients, read in the statistics' one read (the Trainer's
// multi-rank steps): `tensor` holds `ranks` rows, each a rank's loss then its other values;
// `decode` (when given) turns the numbers read into those rows first (values carried in the
// gradient buckets arrive encoded). measure() fills `values` with every row.
struct PackedValues {
  at::Tensor tensor;
  int ranks = 1;
  std::function<std::vector<double>(const std::vector<double>&)> decode;
  std::vector<double> values;
};

// What a bad step does to the gradients it leaves: the Trainer drops them itself (keep), the
// Python GradScaler unscales them as torch.amp.GradScaler.unscale_ does (unscale).
enum class SkippedGradients { keep, unscale };

// The AMP iteration of docs/architecture.md's "One optimizer step" without the model and the
// optimizer, for one or more optimizers: the scale (2), the statistics (4), the NaN policy's
// decision (5), unscale and clip in one multiply or folded into a fused optimizer (6), the merge
// over the iteration's optimizers, the counters and the scaler's update (8). The caller runs
// forward, backward and the gradients' averaging before, and its optimizers between
// after_backward and finish_iteration. The Trainer is built on it, and so is the Python
// GradScaler (python/), whose optimizers are Python ones: one engine for both. The strategies of
// a StrategySet are guarded (core/registry/src/guarded_strategies.h): every call into them is a
// plugin call, so a fault there is reported by plugin name.
class AmpStep {
 public:
  // The strategies must outlive the step.
  explicit AmpStep(AmpStrategies strategies);

  // Every strategy's start(), once, before the first step.
  void start(const RunInfo& info);
  bool started() const { return started_; }
  // The strategies after one was made again with other options (StrategySet::reconfigure).
  void set_strategies(AmpStrategies strategies);

  // 2. The scale of this step's backward: read once, the same for all its micro-batches.
  double scale() const;

  // The outcome an iteration starts from: its step number, the skips before it, the scale.
  StepOutcome begin_iteration() const;

  // 4-6 for one optimizer's gradients (table.read_gradients() first): one statistics pass into
  // out.stats (whose loss the caller set, or `loss`: a small tensor read with the statistics;
  // `packed`: every rank's values, whose losses' mean becomes the loss), the NaN policy's decision,
  // and on a good step the clip coefficient and unscale: returns the factor the gradients still
  // need, 1 when they were multiplied here, coefficient / scale when `fold` and the clipper takes
  // one coefficient (the caller's fused optimizer divides by its inverse, torch's grad_scale). A
  // bad step leaves the gradients as `skipped` says. out.stepped says whether the optimizer may
  // step; the outcome is kept for finish_iteration.
  struct Gradients {
    GradientTable& table;
    bool fold = false;
    SkippedGradients skipped = SkippedGradients::keep;
    at::Tensor loss;                 // undefined: out.stats.loss as the caller set it
    PackedValues* packed = nullptr;  // multi-rank steps
  };
  double after_backward(const Gradients& gradients, StepOutcome& out);

  // The deferred step's host side (deferred_step.h): the iteration of one optimizer whose
  // statistics the device measured and decided on, given to the host forms afterwards (`out`
  // holds the delivered statistics): the policy's decision, the clip coefficient, the counters and
  // the scaler's update, as after_backward and finish_iteration make them, with no gradient pass.
  StepOutcome deliver(StepOutcome out);
  // The same, but the iteration stays open (not counted, the scaler not updated): the host forms
  // take over an iteration the device began (a state change between step() and update(),
  // update(new_scale), a second optimizer), and the caller finishes it. Returns the outcome.
  StepOutcome deliver_open(StepOutcome out);

  // A rollback decision that the caller carried out: the snapshot it restored had taken
  // `restored_taken` steps; the steps taken since count as discarded.
  void rolled_back(int64_t restored_taken);

  // 5 and 8: the iteration's outcomes merged (an overflow or a bad decision in any optimizer
  // counts; squared norms add), counted, the scaler's one extra backoff where the decision was
  // skip_backoff, then the scaler's update with these statistics (after the optimizers: never
  // re-divide). A scaler that refuses to go on (a collapsing scale, on_min_scale=error) turns the
  // step into an abort, with its reason, as a NaN policy's abort. Returns the merged outcome (one
  // optimizer: its own).
  StepOutcome finish_iteration();
  // update(new_scale) of torch's GradScaler: the iteration (if one is open) is counted and the
  // scaler's state "scale" set, its other counters kept; a scaler without one refuses (Error usage).
  void finish_iteration_with_scale(double scale);
  // The optimizers after_backward saw in this iteration.
  size_t iteration_size() const { return iteration_.size(); }
  // The last outcome after_backward produced (its scale_next: the iteration's, once finished).
  const StepOutcome& last_outcome() const { return last_; }

  const StepCounters& counters() const { return counters_; }
  // Restored from a checkpoint; throws Error(checkpoint) for counters no run can reach.
  void restore_counters(const StepCounters& counters);
  const AmpStrategies& strategies() const { return strategies_; }

 private:
  void measure(const Gradients& gradients, StepStats& stats) const;
  void decide(StepOutcome& out) const;
  void clip_coefficient(StepOutcome& out);
  double unscale_and_clip(const GradientTable& table, StepOutcome& out, bool fold);
  void update_scaler(StepOutcome& out);
  void count(const StepOutcome& merged);

  AmpStrategies strategies_;
  bool started_ = false;
  StepCounters counters_;
  std::vector<StepOutcome> iteration_;  // this iteration's after_backward outcomes
  StepOutcome last_;
};

}  // namespace ampkit
