// Plain data the engine hands to strategies: the run's context and one step's statistics.
#pragma once

#include <ampkit/state.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ampkit {

enum class Precision { fp32, bf16, fp16 };

inline const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

// Every precision, in the order --help and messages list them.
inline constexpr Precision kPrecisions[] = {Precision::fp32, Precision::bf16, Precision::fp16};

// The precision `to_string` spells as `text`, or nothing.
inline std::optional<Precision> parse_precision(const std::string& text) {
  for (const Precision p : kPrecisions)
    if (text == to_string(p)) return p;
  return std::nullopt;
}

// "fp32|bf16|fp16" (with `separator` "|"), for messages and help that list the precisions.
inline std::string precision_names(const std::string& separator) {
  std::string out;
  for (const Precision p : kPrecisions) out += (out.empty() ? "" : separator) + to_string(p);
  return out;
}

// What every strategy learns once, before the first step.
struct RunInfo {
  Precision precision = Precision::fp32;
  bool cuda = false;  // parameters and gradients live on a CUDA device
  int rank = 0;
  int world_size = 1;
  int accumulation_steps = 1;
  std::vector<std::string> parameter_names;  // order of StepStats::tensor_norms
};

// Statistics of one optimizer step, from the engine's single pass over the (scaled) gradients,
// taken after the gradients were averaged across ranks: every rank sees the same numbers.
struct StepStats {
  int64_t step = 0;   // index of the optimizer step being attempted, from 0
  double loss = 0.0;  // mean fp32 loss over the micro-batches (not scaled)
  bool loss_finite = true;
  double scale = 1.0;           // loss scale the backward used
  double grad_norm_scaled = 0;  // L2 norm of all scaled gradients together
  double grad_norm = 0;         // the same, unscaled: grad_norm_scaled / scale
  double grad_max_abs = 0;      // largest |g| of the unscaled gradients (the inf-norm)
  double grad_max_abs_scaled = 0;
  double zero_fraction = 0;  // fraction of gradient elements exactly 0 (underflow indicator)
  int64_t grad_elements = 0;
  bool found_inf = false;            // the loss or some gradient is inf/NaN
  std::vector<double> tensor_norms;  // per-parameter L2 of the unscaled gradients
  int64_t consecutive_skips = 0;     // skipped steps in a row before this one
};

// What a NaN policy tells the engine to do with the step.
enum class NanAction {
  proceed,       // step normally
  skip,          // drop the gradients, do not step the optimizer or the scheduler
  skip_backoff,  // skip, and ask the scaler for one extra backoff
  rollback,      // skip, restore the last good snapshot (needs a snapshot handle)
  abort,         // stop the run with a report
  clip,          // a finite spike: step, with the gradient norm clipped to NanDecision::clip_norm
};

inline const char* to_string(NanAction a) {
  switch (a) {
    case NanAction::proceed:
      return "proceed";
    case NanAction::skip:
      return "skip";
    case NanAction::skip_backoff:
      return "skip_backoff";
    case NanAction::rollback:
      return "rollback";
    case NanAction::abort:
      return "abort";
    case NanAction::clip:
      return "clip";
  }
  return "?";
}

struct NanDecision {
  NanAction action = NanAction::proceed;
  std::string reason;        // one line for logs and the report, empty on proceed
  int64_t skip_batches = 0;  // rollback: global batches the data stream skips after the bad one
  double clip_norm = 0;      // clip: the unscaled total gradient norm the step is clipped to (> 0)
};

}  // namespace ampkit
