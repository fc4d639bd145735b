// The AMP step without the optimizer (docs/architecture.md, "One optimizer step", 2 and 4-8).
#include "ampkit/amp_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"

namespace ampkit {

AmpStep::AmpStep(AmpStrategies strategies) : strategies_(strategies) {
  if (!strategies_.scaler || !strategies_.clipper || !strategies_.nan_policy)
    throw Error(ErrorCategory::internal, "AmpStep needs a scaler, a clipper and a NaN policy");
}

// The strategies a StrategySet created are guarded (guarded_strategies.h): each call below is a plugin
// call, reported by name if it crashes, exits or hangs, and a plugin error if it throws.
void AmpStep::start(const RunInfo& info) {
  strategies_.scaler->start(info);
  strategies_.clipper->start(info);
  strategies_.nan_policy->start(info);
}

double AmpStep::scale() const {
  return strategies_.scaler->scale();
}

void AmpStep::measure(const std::vector<at::Tensor>& grads, StepStats& stats, bool on_device,
                      const at::Tensor& packed, int ranks, std::vector<double>* packed_values,
                      const PackedDecoder& decode) const {
  const double scale = stats.scale;
  std::vector<at::Tensor> scalars;
  if (packed.defined()) scalars.push_back(packed);
  std::vector<double> values;
  // The fast path's fused scan reads no device memory; its only read is `packed`'s.
  const GradStats g = compute_grad_stats_on_device(
      grads, scalars, values, on_device ? DeviceStatsRecipe::automatic : DeviceStatsRecipe::fused_scan);
  if (packed.defined()) {
    if (decode) values = decode(values);
    const size_t row = values.size() / static_cast<size_t>(ranks);
    double sum = 0.0;
    for (int r = 0; r < ranks; ++r) sum += values.at(static_cast<size_t>(r) * row);
    stats.loss = sum / ranks;
    if (packed_values != nullptr) *packed_values = std::move(values);
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

NanAction AmpStep::decide(StepOutcome& out) const {
  out.decision = strategies_.nan_policy->decide(out.stats);
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

double AmpStep::unscale_and_clip(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& grads, StepOutcome& out, bool fold) {
  const StepStats& stats = out.stats;
  const ClipResult clip = strategies_.clipper->clip(stats);
  if (!(clip.coefficient > 0.0) || !std::isfinite(clip.coefficient))
    throw Error(ErrorCategory::plugin, "clipper returned clip coefficient " +
                                           std::to_string(clip.coefficient) + "; it must be finite and > 0");
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
  const bool elementwise = strategies_.clipper->clips_elementwise();
  const double factor = out.clip_coefficient / stats.scale;
  if (fold && !elementwise) return factor;  // the fused optimizer's grad_scale: no pass here
  scale_grads_(grads, factor);
  if (!elementwise) return 1.0;
  // value/agc need the tensors: the documented extra pass, on gradients already unscaled.
  // Detached parameters carry no .grad(), so no kept handle reaches a later scaled gradient.
  std::vector<at::Tensor> weights;
  weights.reserve(parameters.size());
  for (const auto& p : parameters) weights.push_back(p.detach());
  out.clip_coefficient *= strategies_.clipper->clip_unscaled_gradients(weights, grads);
  out.grad_norm_clipped = stats.grad_norm * out.clip_coefficient;
  return 1.0;
}

// A scaler stops the run on purpose with TrainingAborted (the dynamic scaler asked to back off at
// its minimum scale), in backoff() or in update(); any other exception is a plugin error and
// propagates.
void AmpStep::back_off() {
  try {
    strategies_.scaler->backoff();
  } catch (const TrainingAborted& e) {
    aborted_in_backoff_ = e.what();
  }
}

void AmpStep::update_scaler(StepOutcome& out, NanAction action) {
  std::string aborted = std::move(aborted_in_backoff_);
  aborted_in_backoff_.clear();
  if (aborted.empty()) try {
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

bool prefers_device_stats(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters)
    if (!p.device().is_cpu() || p.scalar_type() != at::kFloat) return true;
  return false;
}

}  // namespace ampkit
