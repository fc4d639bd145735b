// The AMP step without the optimizer: what runs between the caller's backward and its step.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>
#include <ampkit/step.h>

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

// The phases of docs/architecture.md's "One optimizer step" that need no optimizer and no
// model: the scale (2), the statistics (4), the NaN policy's decision (5), unscale and clip in one
// multiply or folded into a fused optimizer (6), the scaler's update (8). The caller runs forward,
// backward and the gradients' averaging before, and its own optimizer between 6 and 8. Trainer is
// built on it; so is the Python GradScaler (python/), whose optimizer is a Python one. The
// strategies of a StrategySet are guarded (core/registry/src/guarded_strategies.h): every call
// into them is a plugin call, so a fault there is reported by plugin name.
class AmpStep {
 public:
  // The strategies must outlive the step.
  explicit AmpStep(AmpStrategies strategies);

  // Every strategy's start(), once, before the first step.
  void start(const RunInfo& info);

  // 2. The scale of this step's backward: read once, the same for all its micro-batches.
  double scale() const;

  // 4. One statistics pass over the scaled gradients (undefined ones count as empty) into
  // `stats`, whose `scale` and `loss` the caller set; everything a strategy sees is unscaled.
  // `on_device`: the device path, else the CPU fast path. `packed` (when defined): a small float64
  // tensor of `ranks` rows, each a rank's loss then its other values, read in the same copy as
  // the device path's statistics (the step's one read); stats.loss becomes the mean of the rows'
  // losses, summed in rank order, and `packed_values` (when given) receives every value.
  // `decode` (when given) turns the numbers read from `packed` into those rows first (the
  // Trainer's values carried in the gradient buckets arrive encoded).
  using PackedDecoder = std::function<std::vector<double>(const std::vector<double>&)>;
  void measure(const std::vector<at::Tensor>& grads, StepStats& stats, bool on_device,
               const at::Tensor& packed = at::Tensor(), int ranks = 1,
               std::vector<double>* packed_values = nullptr, const PackedDecoder& decode = nullptr) const;

  // 5. The NaN policy decides; a policy may not step on non-finite gradients (the parameters
  // would be destroyed), so its proceed is overruled then.
  NanAction decide(StepOutcome& out) const;

  // 6. The clipper's coefficient from the unscaled statistics, capped by a clip decision's norm.
  // Returns the factor the gradients still need. With `fold` and a global-coefficient clipper
  // they are left as they are and the factor is coefficient / scale: the caller's fused
  // optimizer divides by its inverse (torch's grad_scale), so no pass over the gradients is
  // made here. Otherwise they are multiplied by coefficient / scale in one pass, an element-wise
  // clipper (value, agc) gets its extra pass on the unscaled gradients, and 1 is returned.
  // `parameters[i]` is the weight of `grads[i]`.
  double unscale_and_clip(const std::vector<at::Tensor>& parameters, const std::vector<at::Tensor>& grads,
                          StepOutcome& out, bool fold);

  // 5. A skip_backoff decision: the scaler's one extra reduction.
  void back_off();

  // 8. The scaler's update with this step's statistics (after the optimizer: never re-divide).
  // A scaler that refuses to go on (a collapsing scale, on_min_scale=error) turns the step into
  // an abort, with its reason, as a NaN policy's abort.
  void update_scaler(StepOutcome& out, NanAction action);

  const AmpStrategies& strategies() const { return strategies_; }

 private:
  AmpStrategies strategies_;
  std::string aborted_in_backoff_;  // a backoff() that stopped the run: update_scaler() says so
};

// Where the statistics pass runs by default: the CPU fast path for fp32 CPU parameters, the
// device path (one host read) otherwise.
bool prefers_device_stats(const std::vector<at::Tensor>& parameters);

}  // namespace ampkit
