// The metrics record of an engine step: where libampkit joins its engine and metrics parts, so
// that neither includes the other (docs/architecture.md, "Layout").
#pragma once

#include <ampkit/amp_step.h>
#include <ampkit/step_record.h>

#include <cstdint>

namespace ampkit {

// `outcome`'s numbers, with the caller's: the epoch, the steps skipped so far (the Trainer's
// steps_skipped()), the throughput and the seconds since training started.
inline StepRecord step_record(const StepOutcome& outcome, int64_t epoch, int64_t skipped_total,
                              double samples_per_second, double elapsed_seconds) {
  StepRecord r;
  r.step = outcome.stats.step;
  r.epoch = epoch;
  r.loss = outcome.stats.loss;
  r.scale = outcome.stats.scale;
  r.scale_next = outcome.scale_next;
  r.grad_norm = outcome.stats.grad_norm;
  r.grad_norm_clipped = outcome.grad_norm_clipped;
  r.grad_max_abs = outcome.stats.grad_max_abs;
  r.zero_fraction = outcome.stats.zero_fraction;
  r.clip_coef = outcome.clip_coefficient;
  r.clip_threshold = outcome.clip_threshold;
  r.clipped = outcome.stepped && outcome.clip_coefficient < 1.0;
  r.found_inf = outcome.stats.found_inf;
  r.action = outcome.decision.action;
  r.reason = outcome.decision.reason;
  r.stepped = outcome.stepped;
  r.skipped_steps = skipped_total;
  r.lr = outcome.lr;
  r.samples_per_second = samples_per_second;
  r.time = elapsed_seconds;
  return r;
}

}  // namespace ampkit
