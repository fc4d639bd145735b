// The AMP step pipeline (docs/architecture.md, "One optimizer step").
#include "ampkit/trainer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <unordered_map>

#include "ampkit/deferred_step.h"
#include "ampkit/error.h"
#include "ampkit/gradient_table.h"
#include "ampkit/step_values_carrier.h"

namespace ampkit {

namespace {
AmpStrategies amp_strategies(const TrainerStrategies& s) {
  if (!s.scaler || !s.clipper || !s.nan_policy || !s.comm)
    throw Error(ErrorCategory::internal,
                "Trainer needs a scaler, a clipper, a NaN policy and a comm backend");
  return {s.scaler, s.clipper, s.nan_policy};
}
}  // namespace

double LrSchedule::at(int64_t k, int64_t steps_lost) const {
  if (warmup_steps > 0 && k < warmup_steps)
    return base_lr * static_cast<double>(k + 1) / static_cast<double>(warmup_steps);
  const int64_t horizon = total_steps - std::max<int64_t>(steps_lost, 0);
  if (kind == Kind::cosine && horizon > warmup_steps) {
    const double span = static_cast<double>(horizon - warmup_steps);
    const double t = std::min(1.0, static_cast<double>(k - warmup_steps) / span);
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * t));
  }
  return base_lr;
}

Trainer::Trainer(Precision precision, int accumulation_steps, std::vector<at::Tensor> parameters,
                 std::vector<std::string> names, torch::optim::Optimizer& optimizer,
                 TrainerStrategies strategies, LrSchedule schedule)
    : precision_(precision),
      accumulation_steps_(accumulation_steps),
      parameters_(std::move(parameters)),
      names_(std::move(names)),
      optimizer_(optimizer),
      unscaling_(dynamic_cast<UnscalingOptimizer*>(&optimizer)),
      strategies_(strategies),
      amp_(amp_strategies(strategies)),
      schedule_(schedule),
      table_(std::make_unique<GradientTable>(parameters_, names_)) {
  if (accumulation_steps_ < 1)
    throw Error(ErrorCategory::usage,
                "accumulation steps must be >= 1, got " + std::to_string(accumulation_steps_));
  if (names_.size() != parameters_.size())
    throw Error(ErrorCategory::internal, "Trainer: parameter names and parameters differ in count");
  for (const auto& p : parameters_)
    if (p.scalar_type() != at::kFloat)
      throw Error(ErrorCategory::usage,
                  "master weights must be fp32 (autocast lowers precision per op); got " +
                      std::string(c10::toString(p.scalar_type())));
  set_lr(scheduled_lr());
}

Trainer::~Trainer() = default;

void Trainer::start(const RunInfo& extra) {
  RunInfo info = extra;
  info.precision = precision_;
  info.accumulation_steps = accumulation_steps_;
  info.parameter_names = names_;
  info.cuda = !parameters_.empty() && parameters_.front().is_cuda();
  strategies_.comm->start(info);
  amp_.start(info);
  started_ = true;
}

void Trainer::restore_counters(const TrainerCounters& c) {
  amp_.restore_counters(c);
  set_lr(scheduled_lr());
}

void Trainer::set_stats_recipe(DeviceStatsRecipe recipe) {
  table_ = std::make_unique<GradientTable>(parameters_, names_, recipe);
}

void Trainer::set_lr(double lr) {
  for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr);
}

void Trainer::zero_grad() {
  for (auto& p : parameters_) p.mutable_grad() = at::Tensor();
  if (carrier_) carrier_->clear_gradient();
}

// One optimizer step, in the order of docs/architecture.md's "One optimizer step"; 2 and 4-8 are
// the engine's AmpStep, shared with the Python GradScaler.
StepOutcome Trainer::step(const std::function<at::Tensor(int)>& forward) {
  if (!started_) start(RunInfo{});
  StepOutcome out = amp_.begin_iteration();  // 2: the scale, read once
  // A skip since the last step shortens the cosine's horizon (LrSchedule): set it again.
  out.lr = scheduled_lr();
  set_lr(out.lr);
  forward_backward(forward, out.stats.scale);  // 1, 2
  average_across_ranks();                      // 3
  PackedValues packed;
  packed.tensor = step_values_;
  packed.ranks = carrier_ ? carrier_->world() : static_cast<int>(step_values_.size(0));
  if (carrier_)
    packed.decode = [this](const std::vector<double>& read) { return carrier_->decode(read, row_length_); };
  // 4-6: statistics, decision, and the factor the gradients still need (a clip decision caps the
  // norm further): 1 when they were multiplied here, folded into the optimizer's own pass otherwise.
  const double factor =
      amp_.after_backward({*table_, folds_unscale(), SkippedGradients::keep, at::Tensor(), &packed}, out);
  out.rank_values = rank_values_of(std::move(packed.values), packed.ranks);
  if (out.stepped)
    take_optimizer_step(factor);  // 7
  else
    recover(out, forward);                     // 5: skip, backoff or rollback
  StepOutcome done = amp_.finish_iteration();  // 8: counted, the scaler's update
  done.rank_values = std::move(out.rank_values);
  if (out.stepped || out.decision.action == NanAction::rollback) set_lr(scheduled_lr());
  return done;
}

// 1, 2: each micro-batch's forward under autocast, then the backward of loss * scale / accumulate.
// The mean loss over the micro-batches (unscaled, this rank's) stays on the device, summed in
// float64, until the step's one read (step 4).
void Trainer::forward_backward(const std::function<at::Tensor(int)>& forward, double scale,
                               const at::Tensor& device_scale) {
  const c10::DeviceType device = parameters_.empty() ? c10::kCPU : parameters_.front().device().type();
  if (reducer_ && data_parallel_.broadcast_buffers && !data_parallel_.buffers.empty()) {
    at::NoGradGuard no_grad;
    strategies_.comm->broadcast(data_parallel_.buffers, 0);
  }
  zero_grad();
  at::Tensor loss_sum, micro_batches;  // the count as a tensor on the device: CUDA multiplies by the
                                       // reciprocal of a plain-number divisor, the host divides
  for (int micro = 0; micro < accumulation_steps_; ++micro) {
    // 3. With the Reducer, only the last micro-batch's backward communicates (DDP's no_sync for
    // the others): its autograd hooks do nothing unless prepare_for_backward armed them, which
    // is also why the NaN locator's re-run of a step never reaches the network.
    const bool sync = reducer_ && micro == accumulation_steps_ - 1;
    if (sync) {
      reducer_->rebuild_buckets();  // once, after the first step recorded the order of gradients
      reducer_->prepare_for_forward();
    }
    at::Tensor loss;
    {
      AutocastGuard autocast(precision_, device);  // 1. forward under autocast
      loss = forward(micro);
    }
    if (!loss.defined() || loss.numel() != 1)
      throw Error(ErrorCategory::internal, "the forward function must return a scalar loss");
    loss = loss.to(at::kFloat);
    const at::Tensor loss64 = loss.detach().to(at::kDouble).reshape({1});
    loss_sum = loss_sum.defined() ? loss_sum + loss64 : loss64;
    if (!micro_batches.defined()) micro_batches = at::scalar_tensor(accumulation_steps_, loss64.options());
    // 2. scaled backward (the device's scale: divided in float64 and rounded to float once, as the
    // synchronous step's double is)
    at::Tensor scaled =
        device_scale.defined()
            ? loss * device_scale.to(at::kDouble).div(micro_batches.to(device_scale.device())).to(at::kFloat)
            : loss * (scale / accumulation_steps_);
    if (sync && carrier_) {  // 3. this rank's values ride in the gradient buckets
      step_loss_ = loss_sum.div(micro_batches);
      scaled = carrier_->attach(scaled, rank_row());
    }
    if (sync)
      reducer_->prepare_for_backward(data_parallel_.find_unused_parameters ? std::vector<at::Tensor>{scaled}
                                                                           : std::vector<at::Tensor>{});
    scaled.backward();
  }
  step_loss_ = loss_sum.div(micro_batches);
}

// This rank's loss then the caller's values (set_rank_values), float64 on the loss's device.
at::Tensor Trainer::rank_row() {
  at::Tensor row = step_loss_;
  if (rank_values_) {
    const std::vector<double> mine = rank_values_();
    if (!mine.empty())
      row = at::cat(
          {row,
           at::tensor(at::ArrayRef<double>(mine), at::TensorOptions().dtype(at::kDouble)).to(row.device())});
  }
  row_length_ = row.numel();
  return row;
}

// 3. Average across ranks: the gradients by the Reducer during backward, otherwise here (identity
// for one process). Every rank's loss and the caller's values (set_rank_values) reach every rank,
// read with the statistics in step 4, so every rank logs the same mean loss and a non-finite loss
// on any rank makes every rank take the same decision. With the Reducer they rode in
// its buckets (StepValuesCarrier): no collective besides the gradients'. Without it, one small
// all_gather. One process: the loss alone, no collective.
void Trainer::average_across_ranks() {
  CommBackend& comm = *strategies_.comm;
  const std::vector<at::Tensor>& grads = table_->read_gradients();
  for (size_t i = 0; i < grads.size(); ++i)  // a layout check each: no pass over the gradients
    if (grads[i].defined() && grads[i].is_sparse())
      throw Error(ErrorCategory::data,
                  "parameter '" + table_->names()[i] +
                      "' has a sparse gradient (an nn.Embedding or EmbeddingBag with sparse=True): the "
                      "optimizers here take dense gradients (make the module with sparse=False)");
  if (!reducer_) {
    std::vector<at::Tensor> defined;
    for (const auto& g : grads)
      if (g.defined()) defined.push_back(g);
    comm.all_reduce_mean(defined);
  }
  if (comm.world_size() == 1) {
    step_values_ = step_loss_.reshape({1, 1});
    return;
  }
  step_values_ = carrier_ ? carrier_->gathered() : comm.all_gather(rank_row());
}

// The values of set_rank_values from step 4's read: every rank's row without its loss.
std::vector<double> Trainer::rank_values_of(std::vector<double> packed, int ranks) const {
  if (ranks == 1) return {};
  const size_t row = packed.size() / static_cast<size_t>(ranks);
  std::vector<double> out;
  out.reserve(packed.size() - static_cast<size_t>(ranks));
  for (size_t i = 0; i < packed.size(); ++i)
    if (i % row != 0) out.push_back(packed[i]);
  return out;
}

// 5. A step not taken: the bad-step observer (the host's NaN locator) sees it first, while the
// parameters are still those the step saw; then the rollback (the scaler's extra backoff is
// AmpStep::finish_iteration's).
void Trainer::recover(const StepOutcome& out, const std::function<at::Tensor(int)>& forward) {
  zero_grad();
  if (bad_step_observer_) (void)bad_step_observer_(out, forward);
  if (out.decision.action != NanAction::rollback) return;
  if (!rollback_)
    throw Error(ErrorCategory::internal,
                "the NaN policy asked for a rollback, but the host gave the Trainer no rollback handler");
  amp_.rolled_back(rollback_());
}

// 7. The optimizer step; the schedule advances only with it. A folded factor reaches the optimizer as
// torch's grad_scale, its inverse: the kernel divides each gradient by it on its way through.
void Trainer::take_optimizer_step(double factor) {
  if (factor != 1.0)
    unscaling_->step_unscaling(1.0 / factor);
  else
    optimizer_.step();
}

}  // namespace ampkit
