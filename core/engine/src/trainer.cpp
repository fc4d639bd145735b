// The AMP step pipeline (docs/architecture.md, "One optimizer step").
#include "ampkit/trainer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <unordered_map>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "ampkit/plugin_call.h"

namespace ampkit {

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
                 std::vector<std::string> names, torch::optim::Optimizer& optimizer, Strategies strategies,
                 LrSchedule schedule)
    : precision_(precision),
      accumulation_steps_(accumulation_steps),
      parameters_(std::move(parameters)),
      names_(std::move(names)),
      optimizer_(optimizer),
      strategies_(strategies),
      schedule_(schedule) {
  if (accumulation_steps_ < 1)
    throw Error(ErrorCategory::usage,
                "accumulation steps must be >= 1, got " + std::to_string(accumulation_steps_));
  if (!strategies_.scaler || !strategies_.clipper || !strategies_.nan_policy || !strategies_.comm)
    throw Error(ErrorCategory::internal,
                "Trainer needs a scaler, a clipper, a NaN policy and a comm backend");
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
  {
    PluginCall call("comm", "start()");
    strategies_.comm->start(info);
  }
  {
    PluginCall call("scaler", "start()");
    strategies_.scaler->start(info);
  }
  {
    PluginCall call("clipper", "start()");
    strategies_.clipper->start(info);
  }
  PluginCall call("nan_policy", "start()");
  strategies_.nan_policy->start(info);
  started_ = true;
}

void Trainer::restore_counters(int64_t attempted, int64_t taken, int64_t consecutive_skips, int64_t discarded,
                               int64_t rollbacks) {
  if (taken < 0 || discarded < 0 || taken + discarded > attempted)
    throw Error(ErrorCategory::checkpoint,
                "inconsistent step counters: attempted " + std::to_string(attempted) + ", taken " +
                    std::to_string(taken) + ", discarded " + std::to_string(discarded));
  attempted_ = attempted;
  taken_ = taken;
  discarded_ = discarded;
  skipped_ = attempted - taken - discarded;
  rollbacks_ = rollbacks;
  consecutive_skips_ = consecutive_skips;
  set_lr(scheduled_lr());
}

std::vector<at::Tensor> Trainer::gradients() const {
  std::vector<at::Tensor> grads;
  grads.reserve(parameters_.size());
  for (const auto& p : parameters_) grads.push_back(p.grad());
  return grads;
}

void Trainer::set_lr(double lr) {
  for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr);
}

void Trainer::zero_grad() {
  for (auto& p : parameters_) p.mutable_grad() = at::Tensor();
}

// One optimizer step, in the order of docs/architecture.md's "One optimizer step".
StepOutcome Trainer::step(const std::function<at::Tensor(int)>& forward) {
  if (!started_) start(RunInfo{});
  StepOutcome out;
  begin_step(out);
  out.stats.loss = forward_backward(forward, out.stats.scale);      // 1, 2
  std::vector<at::Tensor> grads = average_across_ranks(out.stats);  // 3
  measure_gradients(grads, out.stats);                              // 4
  const NanAction action = decide(out);                             // 5
  if (action == NanAction::proceed || action == NanAction::clip) {
    clip_unscaled(grads, out);  // 6 (a clip decision caps the norm further)
    take_optimizer_step(out);   // 7
  } else {
    recover(action, out, forward);  // 5: skip, backoff or rollback
  }
  ++attempted_;
  update_scaler(out, action);  // 8
  return out;
}

void Trainer::begin_step(StepOutcome& out) {
  out.stats.step = attempted_;
  out.stats.consecutive_skips = consecutive_skips_;
  // 2. The scale is read once: every micro-batch of this step uses the same value.
  {
    PluginCall call("scaler", "scale()");
    out.stats.scale = strategies_.scaler->scale();
  }
  // A skip since the last step shortens the cosine's horizon (LrSchedule): set it again.
  out.lr = scheduled_lr();
  set_lr(out.lr);
}

// 1, 2: each micro-batch's forward under autocast, then the backward of loss * scale / accumulate.
// Returns the mean loss over the micro-batches (unscaled, this rank's).
double Trainer::forward_backward(const std::function<at::Tensor(int)>& forward, double scale) {
  const c10::DeviceType device = parameters_.empty() ? c10::kCPU : parameters_.front().device().type();
  if (reducer_ && data_parallel_.broadcast_buffers && !data_parallel_.buffers.empty()) {
    at::NoGradGuard no_grad;
    PluginCall call("comm", "broadcast()");
    strategies_.comm->broadcast(data_parallel_.buffers, 0);
  }
  zero_grad();
  const bool on_device = uses_device_stats();
  device_loss_ = at::Tensor();
  double loss_sum = 0.0;
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
    if (on_device)  // summed in float64 on the device, read with the statistics (step 4)
      device_loss_ = device_loss_.defined() ? device_loss_ + loss.detach().to(at::kDouble)
                                            : loss.detach().to(at::kDouble);
    else
      loss_sum += read_scalar(loss);
    at::Tensor scaled = loss * (scale / accumulation_steps_);  // 2. scaled backward
    if (sync)
      reducer_->prepare_for_backward(data_parallel_.find_unused_parameters ? std::vector<at::Tensor>{scaled}
                                                                           : std::vector<at::Tensor>{});
    scaled.backward();
  }
  if (on_device) {
    device_loss_ = device_loss_ / static_cast<double>(accumulation_steps_);
    return std::numeric_limits<double>::quiet_NaN();  // known after the statistics' read
  }
  return loss_sum / accumulation_steps_;
}

bool Trainer::uses_device_stats() const {
  if (stats_path_ != StatsPath::automatic) return stats_path_ == StatsPath::device;
  for (const auto& p : parameters_)
    if (!p.device().is_cpu() || p.scalar_type() != at::kFloat) return true;
  return false;
}

// 3. Average across ranks: the gradients by the Reducer during backward, otherwise here (identity
// for one process); the loss of the global batch always, so every rank logs the same number and a
// non-finite loss on any rank makes every rank take the same decision.
std::vector<at::Tensor> Trainer::average_across_ranks(StepStats& stats) {
  CommBackend& comm = *strategies_.comm;
  if (device_loss_.defined()) {  // the device path: averaged on the device, read in step 4
    if (comm.world_size() > 1) {
      std::vector<at::Tensor> loss_tensor = {device_loss_.reshape({1})};
      comm.all_reduce_mean(loss_tensor);
      device_loss_ = loss_tensor[0];
    }
  } else if (comm.world_size() > 1) {
    std::vector<at::Tensor> loss_tensor = {
        at::full({1}, stats.loss,
                 at::TensorOptions()
                     .dtype(at::kDouble)
                     .device(parameters_.empty() ? at::Device(at::kCPU) : parameters_.front().device()))};
    comm.all_reduce_mean(loss_tensor);
    stats.loss = read_scalar(loss_tensor[0]);
  }
  stats.loss_finite = std::isfinite(stats.loss);
  std::vector<at::Tensor> grads = gradients();
  if (!reducer_) {
    std::vector<at::Tensor> defined;
    for (const auto& g : grads)
      if (g.defined()) defined.push_back(g);
    comm.all_reduce_mean(defined);
  }
  return grads;
}

// 4. One statistics pass over the scaled gradients; everything a strategy sees is unscaled.
void Trainer::measure_gradients(const std::vector<at::Tensor>& grads, StepStats& stats) const {
  const double scale = stats.scale;
  GradStats g;
  if (device_loss_.defined()) {
    std::vector<double> loss;
    g = compute_grad_stats_on_device(grads, {device_loss_}, loss);
    stats.loss = loss.at(0);
    stats.loss_finite = std::isfinite(stats.loss);
  } else {
    g = compute_grad_stats(grads);
  }
  stats.grad_norm_scaled = std::sqrt(g.sum_squares);
  stats.grad_norm = stats.grad_norm_scaled / scale;
  stats.grad_max_abs_scaled = g.max_abs;
  stats.grad_max_abs = g.max_abs / scale;
  stats.grad_elements = g.elements;
  stats.zero_fraction = g.elements ? static_cast<double>(g.zeros) / static_cast<double>(g.elements) : 0.0;
  stats.found_inf = !stats.loss_finite || !g.finite();
  stats.tensor_norms.reserve(g.tensor_sum_squares.size());
  for (double s : g.tensor_sum_squares) stats.tensor_norms.push_back(std::sqrt(s) / scale);
}

// 5. The NaN policy decides; a policy may not step on non-finite gradients (the parameters would
// be destroyed), so its proceed is overruled then.
NanAction Trainer::decide(StepOutcome& out) const {
  {
    PluginCall call("nan_policy", "decide()");
    out.decision = strategies_.nan_policy->decide(out.stats);
  }
  const NanAction said = out.decision.action;
  if ((said == NanAction::proceed || said == NanAction::clip) && out.stats.found_inf)
    out.decision = {NanAction::skip, std::string("non-finite gradients (the policy said ") + to_string(said) +
                                         "; skipped anyway)"};
  if (out.decision.action == NanAction::clip &&
      (!(out.decision.clip_norm > 0.0) || !std::isfinite(out.decision.clip_norm)))
    throw Error(ErrorCategory::plugin, "NaN policy decided clip with clip_norm " +
                                           std::to_string(out.decision.clip_norm) +
                                           "; it must be finite and > 0");
  return out.decision.action;
}

// 5. A step not taken: the bad-step observer (the host's NaN locator) sees it first, while the
// parameters are still those the step saw; then the scaler's extra backoff or the rollback.
void Trainer::recover(NanAction action, StepOutcome& out, const std::function<at::Tensor(int)>& forward) {
  zero_grad();
  ++skipped_;
  ++consecutive_skips_;
  if (bad_step_observer_) bad_step_observer_(out, forward);
  if (action == NanAction::skip_backoff) {
    PluginCall call("scaler", "backoff()");
    strategies_.scaler->backoff();
  }
  if (action != NanAction::rollback) return;
  if (!rollback_)
    throw Error(ErrorCategory::internal,
                "the NaN policy asked for a rollback, but the host gave the Trainer no rollback handler");
  const int64_t restored_taken = rollback_();
  if (restored_taken < 0 || restored_taken > taken_)
    throw Error(ErrorCategory::internal, "rollback restored a snapshot from the future (step " +
                                             std::to_string(restored_taken) + " of " +
                                             std::to_string(taken_) + ")");
  discarded_ += taken_ - restored_taken;
  taken_ = restored_taken;
  ++rollbacks_;
  consecutive_skips_ = 0;
  set_lr(scheduled_lr());
}

// 6. The clipper's coefficient from the unscaled statistics; unscale and clip in one multiply.
void Trainer::clip_unscaled(std::vector<at::Tensor>& grads, StepOutcome& out) {
  const StepStats& stats = out.stats;
  ClipResult clip;
  {
    PluginCall call("clipper", "clip()");
    clip = strategies_.clipper->clip(stats);
  }
  if (!(clip.coefficient > 0.0) || !std::isfinite(clip.coefficient))
    throw Error(ErrorCategory::internal, "clipper returned coefficient " + std::to_string(clip.coefficient));
  out.clip_coefficient = std::min(clip.coefficient, 1.0);
  out.clip_threshold = clip.threshold;
  // A spike the NaN policy lets through clipped: its norm cap wins where it is tighter.
  if (out.decision.action == NanAction::clip && stats.grad_norm > 0.0) {
    const double spike_coefficient = out.decision.clip_norm / stats.grad_norm;
    if (spike_coefficient < out.clip_coefficient) {
      out.clip_coefficient = spike_coefficient;
      out.clip_threshold = out.decision.clip_norm;
    }
  }
  out.grad_norm_clipped = stats.grad_norm * out.clip_coefficient;
  scale_grads_(grads, out.clip_coefficient / stats.scale);
  if (!strategies_.clipper->clips_elementwise()) return;
  // value/agc need the tensors: the documented extra pass, on gradients already unscaled.
  // Detached parameters carry no .grad(), so no kept handle reaches a later scaled gradient.
  std::vector<at::Tensor> weights;
  weights.reserve(parameters_.size());
  for (const auto& p : parameters_) weights.push_back(p.detach());
  PluginCall call("clipper", "clip_unscaled_gradients()");
  out.clip_coefficient *= strategies_.clipper->clip_unscaled_gradients(weights, grads);
  out.grad_norm_clipped = stats.grad_norm * out.clip_coefficient;
}

// 7. The optimizer step; the schedule advances only with it.
void Trainer::take_optimizer_step(StepOutcome& out) {
  optimizer_.step();
  ++taken_;
  set_lr(scheduled_lr());
  out.stepped = true;
  consecutive_skips_ = 0;
}

// 8. The scaler's update with this step's statistics (after the step: never re-divide). A scaler
// that refuses to go on (a collapsing scale, on_min_scale=error) stops the run the way a NaN
// policy's abort does: with its reason in the summary and the same exit code.
void Trainer::update_scaler(StepOutcome& out, NanAction action) {
  PluginCall call("scaler", "update()");
  try {
    strategies_.scaler->update(out.stats);
  } catch (const std::exception& e) {
    action = NanAction::abort;
    out.aborted_by_scaler = true;
    out.decision.reason =
        (out.decision.reason.empty() ? "" : out.decision.reason + "; ") + "loss scaler: " + e.what();
  }
  out.scale_next = strategies_.scaler->scale();
  out.decision.action = action;
}

}  // namespace ampkit
