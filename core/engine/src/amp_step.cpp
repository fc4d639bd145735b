// The AMP iteration without the model and the optimizer (docs/architecture.md, "One optimizer
// step", 2 and 4-8): one engine for the Trainer and the Python GradScaler.
#include "ampkit/amp_step.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"

namespace ampkit {

namespace {

// torch's inv_scale: scale.double().reciprocal().float(), the factor its unscale multiplies by.
double inverse_scale(double scale) {
  return static_cast<double>(static_cast<float>(1.0 / scale));
}

}  // namespace

AmpStep::AmpStep(AmpStrategies strategies) {
  set_strategies(strategies);
}

void AmpStep::set_strategies(AmpStrategies strategies) {
  if (!strategies.scaler || !strategies.clipper || !strategies.nan_policy)
    throw Error(ErrorCategory::internal, "AmpStep needs a scaler, a clipper and a NaN policy");
  strategies_ = strategies;
}

// The strategies a StrategySet created are guarded (guarded_strategies.h): each call below is a plugin
// call, reported by name if it crashes, exits or hangs, and a plugin error if it throws.
void AmpStep::start(const RunInfo& info) {
  strategies_.scaler->start(info);
  strategies_.clipper->start(info);
  strategies_.nan_policy->start(info);
  started_ = true;
}

double AmpStep::scale() const {
  return strategies_.scaler->scale();
}

StepOutcome AmpStep::begin_iteration() const {
  StepOutcome out;
  out.stats.step = counters_.attempted;
  out.stats.consecutive_skips = counters_.consecutive_skips;
  out.stats.scale = scale();  // 2. read once: every micro-batch and optimizer of the step uses it
  return out;
}

// 4. One statistics pass over the scaled gradients; everything a strategy sees is unscaled.
void AmpStep::measure(const Gradients& gradients, StepStats& stats) const {
  const double scale = stats.scale;
  std::vector<at::Tensor> scalars;
  if (gradients.packed != nullptr) scalars.push_back(gradients.packed->tensor);
  if (gradients.loss.defined()) scalars.push_back(gradients.loss);
  std::vector<double> values;
  const GradStats g = gradients.table.measure(scalars, values);
  if (gradients.packed != nullptr) {
    PackedValues& packed = *gradients.packed;
    packed.values = packed.decode ? packed.decode(values) : std::move(values);
    const size_t row = packed.values.size() / static_cast<size_t>(packed.ranks);
    double sum = 0.0;
    for (int r = 0; r < packed.ranks; ++r) sum += packed.values.at(static_cast<size_t>(r) * row);
    stats.loss = sum / packed.ranks;
  } else if (gradients.loss.defined()) {
    stats.loss = values.at(0);
  }
  stats.loss_finite = std::isfinite(stats.loss);
  stats.grad_norm_scaled = std::sqrt(g.sum_squares);
  stats.grad_norm = stats.grad_norm_scaled / scale;
  // A maximum does not see NaN elements (every comparison with NaN is false): where the sum of
  // squares is NaN the largest |gradient| is reported as NaN too, never as the finite rest's.
  stats.grad_max_abs_scaled = std::isnan(g.sum_squares) ? std::nan("") : g.max_abs;
  stats.grad_max_abs = stats.grad_max_abs_scaled / scale;
  stats.grad_elements = g.elements;
  stats.zero_fraction = g.elements ? static_cast<double>(g.zeros) / static_cast<double>(g.elements) : 0.0;
  stats.found_inf = !stats.loss_finite || !g.finite();
  stats.tensor_norms.clear();
  stats.tensor_norms.reserve(g.tensor_sum_squares.size());
  for (double s : g.tensor_sum_squares) stats.tensor_norms.push_back(std::sqrt(s) / scale);
}

// 5. The NaN policy decides; a policy may not step on non-finite gradients (the parameters would
// be destroyed), so its proceed is overruled then. Its answer itself (an action the host can carry
// out, a clip's norm) is checked where every call into a plugin is guarded (guarded_strategies.h).
void AmpStep::decide(StepOutcome& out) const {
  out.decision = strategies_.nan_policy->decide(out.stats);
  const NanAction said = out.decision.action;
  if ((said == NanAction::proceed || said == NanAction::clip) && out.stats.found_inf)
    out.decision = {NanAction::skip, std::string("non-finite gradients (the policy said ") + to_string(said) +
                                         "; skipped anyway)"};
  out.stepped = out.decision.action == NanAction::proceed || out.decision.action == NanAction::clip;
}

double AmpStep::after_backward(const Gradients& gradients, StepOutcome& out) {
  measure(gradients, out.stats);  // 4
  decide(out);                    // 5
  double factor = 1.0;
  if (out.stepped)
    factor = unscale_and_clip(gradients.table, out, gradients.fold);  // 6
  else if (gradients.skipped == SkippedGradients::unscale)
    scale_grads_(gradients.table.gradients(), inverse_scale(out.stats.scale));
  iteration_.push_back(out);
  last_ = out;
  return factor;
}

StepOutcome AmpStep::deliver(StepOutcome out) {
  deliver_open(std::move(out));
  return finish_iteration();
}

StepOutcome AmpStep::deliver_open(StepOutcome out) {
  if (!iteration_.empty()) throw Error(ErrorCategory::internal, "AmpStep::deliver inside an iteration");
  out.stats.step = counters_.attempted;
  out.stats.consecutive_skips = counters_.consecutive_skips;
  decide(out);
  if (out.stepped) clip_coefficient(out);
  iteration_.push_back(out);
  last_ = out;
  return out;
}

// 6. The clipper's coefficient from the unscaled statistics (in (0, 1], guarded_strategies.h checks
// it), capped by a clip decision's norm.
void AmpStep::clip_coefficient(StepOutcome& out) {
  const StepStats& stats = out.stats;
  const ClipResult clip = strategies_.clipper->clip(stats);
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
}

// 6. Then the gradients multiplied by coefficient / scale in one pass (torch's inv_scale when
// nothing clips), or that factor returned for a fused optimizer (its grad_scale is the inverse:
// the scale itself when nothing clips, as torch hands it); an element-wise clipper (value, agc)
// gets its extra pass on the unscaled gradients.
double AmpStep::unscale_and_clip(const GradientTable& table, StepOutcome& out, bool fold) {
  clip_coefficient(out);
  const StepStats& stats = out.stats;
  const bool elementwise = strategies_.clipper->clips_elementwise();
  const double factor = out.clip_coefficient / stats.scale;
  if (fold && !elementwise) return factor;  // the fused optimizer's grad_scale: no pass here
  const std::vector<at::Tensor>& grads = table.gradients();
  // Unclipped: torch's inv_scale, to the bit. Clipped: torch's inverse cancels between its norm and
  // its coefficient (g * inv * max / (norm * inv)), so coefficient / scale is the nearer product.
  scale_grads_(grads, out.clip_coefficient == 1.0 ? inverse_scale(stats.scale) : factor);
  if (!elementwise) return 1.0;
  // value/agc need the tensors: the documented extra pass, on gradients already unscaled.
  // Detached parameters carry no .grad(), so no kept handle reaches a later scaled gradient.
  std::vector<at::Tensor> weights;
  weights.reserve(table.parameters().size());
  for (const auto& p : table.parameters()) weights.push_back(p.detach());
  out.clip_coefficient *= strategies_.clipper->clip_unscaled_gradients(weights, grads);
  out.grad_norm_clipped = stats.grad_norm * out.clip_coefficient;
  return 1.0;
}

void AmpStep::rolled_back(int64_t restored_taken) {
  if (restored_taken < 0 || restored_taken > counters_.taken)
    throw Error(ErrorCategory::internal, "rollback restored a snapshot from the future (step " +
                                             std::to_string(restored_taken) + " of " +
                                             std::to_string(counters_.taken) + ")");
  counters_.discarded += counters_.taken - restored_taken;
  counters_.taken = restored_taken;
  ++counters_.rollbacks;
}

void AmpStep::count(const StepOutcome& merged) {
  ++counters_.attempted;
  if (merged.stepped) {
    ++counters_.taken;
    counters_.consecutive_skips = 0;
  } else {
    // A rollback starts the streak again from the restored snapshot.
    counters_.consecutive_skips =
        merged.decision.action == NanAction::rollback ? 0 : counters_.consecutive_skips + 1;
  }
}

StepOutcome AmpStep::finish_iteration() {
  if (iteration_.empty()) throw Error(ErrorCategory::usage, "No inf checks were recorded prior to update.");
  StepOutcome merged = std::move(iteration_.front());
  if (iteration_.size() > 1) {  // the iteration's statistics over all its optimizers
    double squares = merged.stats.grad_norm_scaled * merged.stats.grad_norm_scaled;
    for (size_t i = 1; i < iteration_.size(); ++i) {
      const StepOutcome& o = iteration_[i];
      squares += o.stats.grad_norm_scaled * o.stats.grad_norm_scaled;
      merged.stats.found_inf = merged.stats.found_inf || o.stats.found_inf;
      merged.stats.grad_max_abs_scaled =
          std::max(merged.stats.grad_max_abs_scaled, o.stats.grad_max_abs_scaled);
      merged.stats.grad_elements += o.stats.grad_elements;
      merged.stats.tensor_norms.insert(merged.stats.tensor_norms.end(), o.stats.tensor_norms.begin(),
                                       o.stats.tensor_norms.end());
      merged.stepped = merged.stepped && o.stepped;
      if (merged.decision.action == NanAction::proceed) merged.decision = o.decision;
    }
    merged.stats.grad_norm_scaled = std::sqrt(squares);
    merged.stats.grad_norm = merged.stats.grad_norm_scaled / merged.stats.scale;
    merged.stats.grad_max_abs = merged.stats.grad_max_abs_scaled / merged.stats.scale;
  }
  iteration_.clear();
  count(merged);
  update_scaler(merged);
  last_.scale_next = merged.scale_next;
  return merged;
}

void AmpStep::finish_iteration_with_scale(double scale) {
  if (!(scale > 0.0) || !std::isfinite(scale))
    throw Error(ErrorCategory::usage,
                "new_scale must be a positive finite number, got " + std::to_string(scale));
  State state = strategies_.scaler->save();
  if (!state.has("scale"))
    throw Error(ErrorCategory::usage, "the loss scaler keeps no scale in its state, so it cannot be set");
  if (!iteration_.empty()) {  // update(new_scale) with no step since the last update counts none
    StepOutcome merged;
    merged.stepped =
        std::all_of(iteration_.begin(), iteration_.end(), [](const StepOutcome& o) { return o.stepped; });
    iteration_.clear();
    count(merged);
  }
  // The iteration is over even where the scaler refuses the scale (out of its bounds): it stays.
  state.set("scale", static_cast<double>(static_cast<float>(scale)));
  strategies_.scaler->load(state);
  last_.scale_next = scale;
}

// 5 and 8. A scaler stops the run on purpose with TrainingAborted (the dynamic scaler asked to back
// off at its minimum scale), in backoff() or in update(); any other exception is a plugin error and
// propagates.
void AmpStep::update_scaler(StepOutcome& out) {
  NanAction action = out.decision.action;
  std::string aborted;
  try {
    if (action == NanAction::skip_backoff) strategies_.scaler->backoff();  // the one extra reduction
    strategies_.scaler->update(out.stats);
  } catch (const TrainingAborted& e) {
    aborted = e.what();
  }
  if (!aborted.empty()) {
    action = NanAction::abort;
    out.aborted_by_scaler = true;
    out.decision.reason =
        (out.decision.reason.empty() ? "" : out.decision.reason + "; ") + "loss scaler: " + aborted;
  }
  out.scale_next = strategies_.scaler->scale();
  out.decision.action = action;
}

void AmpStep::restore_counters(const StepCounters& c) {
  if (c.taken < 0 || c.discarded < 0 || c.taken + c.discarded > c.attempted)
    throw Error(ErrorCategory::checkpoint,
                "inconsistent step counters: attempted " + std::to_string(c.attempted) + ", taken " +
                    std::to_string(c.taken) + ", discarded " + std::to_string(c.discarded));
  counters_ = c;
}

}  // namespace ampkit
