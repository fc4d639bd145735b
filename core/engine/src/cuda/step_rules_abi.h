/* The deferred step's rules over a step's totals, one scalar function composed of the built-in
   rules (sdk/include/ampkit/step_rules.h, which the plugins' host forms call too) and compiled
   twice: by nvcc into the one-thread kernel ampkit_step_rules (grad_stats_kernel.cu), and by the
   host compiler for CPU tensors (device_step.cpp). Both run these lines, so what the CPU tests prove
   bit for bit against the host forms (test_device_step, test_host_sync,
   tests/python/test_deferred_step.py) is what the GPU runs, in one launch. Every value is rounded
   as the host forms round it: products and quotients in float64, scales in float32, and no fused
   multiply-add on either side (no expression here or in step_rules.h adds a product to anything,
   so no compiler contracts one). Plain data: the same layout on both sides. */
#ifndef AMPKIT_STEP_RULES_ABI_H
#define AMPKIT_STEP_RULES_ABI_H

#include <ampkit/step_rules.h>

/* The three strategies' declared rules (sdk/include/ampkit/device_rules.h), flattened. */
typedef struct {
  int dynamic; /* scaler: 1 dynamic, 0 constant */
  ampkit_dynamic_scaler_rule scaler;
  int clip_norm; /* clipper: 1 norm, 0 none */
  int inf_norm;
  double max_norm;
  ampkit_nan_policy_rule policy;
} ampkit_step_rules;

/* What persists between steps, float64 (the scale is a float32 of its own). */
enum {
  AMPKIT_RULE_GROWTH,
  AMPKIT_RULE_HYSTERESIS,
  AMPKIT_RULE_CONSECUTIVE,
  AMPKIT_RULE_STOPPED,
  AMPKIT_RULE_STATE
};

/* One step's record (DeferredStep's), float64, in this order; the last only with a reduction. */
enum {
  AMPKIT_RECORD_STEPPED,
  AMPKIT_RECORD_BACKOFF,
  AMPKIT_RECORD_ABORT,
  AMPKIT_RECORD_COEFFICIENT,
  AMPKIT_RECORD_SCALE,
  AMPKIT_RECORD_SCALE_NEXT,
  AMPKIT_RECORD_LOSS,
  AMPKIT_RECORD_SUM_SQUARES,
  AMPKIT_RECORD_MAX_ABS,
  AMPKIT_RECORD_ZEROS,
  AMPKIT_RECORD_GROUP_ELEMENTS
};

/* Where one step reads and writes; every pointer is on the step's device. `loss` and
   `group_elements` may be null (no loss; no reduction). */
typedef struct {
  const double* sum_squares; /* the scaled gradients' totals (grad_stats.h) */
  const double* max_abs;
  const double* zeros;
  const double* loss;
  const double* group_elements;
  float* scale;           /* in: the scale this step's backward used; out: the next */
  double* state;          /* [AMPKIT_RULE_STATE] */
  float* grad_scale;      /* out: what a fused optimizer divides by (scale / clip coefficient) */
  float* found_inf;       /* out: 1 where the step is skipped */
  unsigned char* stepped; /* out: a bool */
  double* record;         /* out: [AMPKIT_RECORD_GROUP_ELEMENTS + 1] */
} ampkit_step_pointers;

/* AmpStep::after_backward and finish_iteration's decisions from the totals, as the host forms
   take them: the NaN policy, the clip coefficient of a step taken, the scaler's extra backoff and
   its update; then what the fused optimizer takes and the record. */
AMPKIT_STEP_RULE_FN void ampkit_step_rules_run(const ampkit_step_rules* r, const ampkit_step_pointers* p) {
  double* s = p->state;
  const float scale = *p->scale;
  const double scale64 = (double)scale;
  const double sum = *p->sum_squares, max_abs = *p->max_abs;
  const double loss = p->loss ? *p->loss : 0.0;
  const int grads_bad = !(AMPKIT_ISFINITE(sum) && !AMPKIT_ISNAN(max_abs));
  const int loss_bad = !AMPKIT_ISFINITE(loss);
  const int bad = loss_bad || grads_bad;
  /* 5. The NaN policy. */
  const int action =
      ampkit_nan_policy_decide(&r->policy, loss_bad, grads_bad, 0, (long long)s[AMPKIT_RULE_CONSECUTIVE]);
  int abort = action == AMPKIT_STEP_ABORT;
  const int backoff = action == AMPKIT_STEP_SKIP_BACKOFF;
  const int stepped = !bad && s[AMPKIT_RULE_STOPPED] == 0.0;
  /* 6. The clip coefficient of a step taken, from the unscaled total norm. */
  double coefficient = 1.0;
  if (r->clip_norm && stepped)
    coefficient = ampkit_norm_clip_coefficient(r->max_norm,
                                               r->inf_norm ? max_abs / scale64 : AMPKIT_SQRT(sum) / scale64);
  /* 8. The dynamic scaler: the policy's extra backoff, then update(found_inf = bad), unless the
     backoff stopped the run (the host form's TrainingAborted skips the update too). */
  float next = scale;
  if (r->dynamic) {
    ampkit_dynamic_scaler_state d = {scale, (long long)s[AMPKIT_RULE_GROWTH],
                                     (long long)s[AMPKIT_RULE_HYSTERESIS]};
    int stops = backoff ? ampkit_dynamic_scaler_backoff(&r->scaler, &d) : 0;
    if (!stops) stops = ampkit_dynamic_scaler_update(&r->scaler, &d, bad);
    abort = abort || stops;
    next = d.scale;
    s[AMPKIT_RULE_GROWTH] = (double)d.growth_tracker;
    s[AMPKIT_RULE_HYSTERESIS] = (double)d.hysteresis_tracker;
  }
  if (abort) s[AMPKIT_RULE_STOPPED] = 1.0;
  s[AMPKIT_RULE_CONSECUTIVE] = stepped ? 0.0 : s[AMPKIT_RULE_CONSECUTIVE] + 1.0;
  *p->scale = next;
  /* 7. What the fused optimizer takes: the inverse of the factor the synchronous step folds in. */
  *p->grad_scale = (float)(1.0 / (coefficient / scale64));
  *p->found_inf = stepped ? 0.0f : 1.0f;
  *p->stepped = (unsigned char)stepped;
  double* out = p->record;
  out[AMPKIT_RECORD_STEPPED] = stepped;
  out[AMPKIT_RECORD_BACKOFF] = backoff;
  out[AMPKIT_RECORD_ABORT] = abort;
  out[AMPKIT_RECORD_COEFFICIENT] = coefficient;
  out[AMPKIT_RECORD_SCALE] = scale64;
  out[AMPKIT_RECORD_SCALE_NEXT] = (double)next;
  out[AMPKIT_RECORD_LOSS] = loss;
  out[AMPKIT_RECORD_SUM_SQUARES] = sum;
  out[AMPKIT_RECORD_MAX_ABS] = max_abs;
  out[AMPKIT_RECORD_ZEROS] = *p->zeros;
  if (p->group_elements) out[AMPKIT_RECORD_GROUP_ELEMENTS] = *p->group_elements;
}

#endif
