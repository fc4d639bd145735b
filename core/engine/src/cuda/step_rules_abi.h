/* The step's device rules (device_step.h) as one scalar function, compiled twice: by nvcc into the
   one-thread kernel ampkit_step_rules (grad_stats_kernel.cu), and by the host compiler for CPU
   tensors (device_step.cpp). Both run these lines, so what the CPU tests prove bit for bit against
   the host forms (test_device_step, test_host_sync, tests/python/test_deferred_step.py) is what
   the GPU runs: one launch where the same rules as ATen operators on 0-dim tensors are some 130
   (DeviceStepRules::step_operators, kept as the reference and for a build without the kernel).
   Every value is rounded as the host forms round it: products and quotients in float64, scales
   in float32, and no fused multiply-add on either side (no expression here adds a product to
   anything, so no compiler contracts one). Plain data: the same layout on both sides. */
#ifndef AMPKIT_STEP_RULES_ABI_H
#define AMPKIT_STEP_RULES_ABI_H

#ifdef __CUDACC__
#define AMPKIT_RULES_FN __host__ __device__ inline
#define AMPKIT_SQRT(x) sqrt(x)
#define AMPKIT_ISFINITE(x) isfinite(x)
#define AMPKIT_ISNAN(x) isnan(x)
#else
#include <cmath>
#define AMPKIT_RULES_FN inline
#define AMPKIT_SQRT(x) std::sqrt(x)
#define AMPKIT_ISFINITE(x) std::isfinite(x)
#define AMPKIT_ISNAN(x) std::isnan(x)
#endif

/* The three strategies' declared rules (sdk/include/ampkit/device_rules.h), flattened. */
typedef struct {
  int dynamic; /* scaler: 1 dynamic, 0 constant */
  int abort_at_min_scale;
  double growth_factor;
  double backoff_factor;
  double growth_interval;
  double hysteresis;
  float min_scale;
  float max_scale;
  int clip_norm; /* clipper: 1 norm, 0 none */
  int inf_norm;
  double max_norm;
  int policy_backoff; /* NaN policy */
  int abort_on_nonfinite_loss;
  int abort_on_nonfinite_gradients;
  double max_consecutive; /* 0: never */
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

/* float(double(scale) * factor): the host forms' rounding. */
AMPKIT_RULES_FN float ampkit_rules_times(float scale, double factor) {
  return (float)((double)scale * factor);
}

/* The dynamic scaler's back_off() where `when`: max(float(scale * backoff_factor), min_scale), or,
   at min_scale with abort_at_min_scale, the scale stays and the run stops (*aborted). */
AMPKIT_RULES_FN float ampkit_rules_back_off(const ampkit_step_rules* r, float scale, int when, int* aborted) {
  const int stops = r->abort_at_min_scale && when && scale <= r->min_scale;
  if (stops) *aborted = 1;
  const float reduced = ampkit_rules_times(scale, r->backoff_factor);
  return when && !stops ? (reduced > r->min_scale ? reduced : r->min_scale) : scale;
}

/* AmpStep::after_backward and finish_iteration's decisions from the totals, as the host forms
   take them: the NaN policy, the clip coefficient of a step taken, the scaler's extra backoff and
   its update; then what the fused optimizer takes and the record. */
AMPKIT_RULES_FN void ampkit_step_rules_run(const ampkit_step_rules* r, const ampkit_step_pointers* p) {
  double* s = p->state;
  const float scale = *p->scale;
  const double scale64 = (double)scale;
  const double sum = *p->sum_squares, max_abs = *p->max_abs;
  const double loss = p->loss ? *p->loss : 0.0;
  const int grads_bad = !(AMPKIT_ISFINITE(sum) && !AMPKIT_ISNAN(max_abs));
  const int loss_bad = !AMPKIT_ISFINITE(loss);
  const int bad = loss_bad || grads_bad;
  /* 5. The NaN policy. */
  int abort = (r->abort_on_nonfinite_loss && loss_bad) ||
              (r->abort_on_nonfinite_gradients && grads_bad && !loss_bad) ||
              (r->max_consecutive > 0 && bad && s[AMPKIT_RULE_CONSECUTIVE] + 1.0 >= r->max_consecutive);
  const int backoff = r->policy_backoff && bad && !abort;
  const int stepped = !bad && s[AMPKIT_RULE_STOPPED] == 0.0;
  /* 6. clip_grad_norm_'s coefficient, max_norm / (norm + 1e-6), at most 1, on a step taken. */
  double coefficient = 1.0;
  if (r->clip_norm) {
    const double total = r->inf_norm ? max_abs / scale64 : AMPKIT_SQRT(sum) / scale64;
    const double c = r->max_norm / (total + 1e-6);
    if (stepped && c < 1.0) coefficient = c;
  }
  /* 8. The dynamic scaler: the policy's extra backoff, then update(found_inf = bad). */
  float next = scale;
  int scaler_stops = 0;
  if (r->dynamic) {
    if (backoff) s[AMPKIT_RULE_GROWTH] = 0.0;
    next = ampkit_rules_back_off(r, next, backoff, &scaler_stops);
    const int runs = !scaler_stops;
    const int overflow = runs && bad;
    if (overflow) {
      s[AMPKIT_RULE_GROWTH] = 0.0;
      if (s[AMPKIT_RULE_HYSTERESIS] > 0.0) s[AMPKIT_RULE_HYSTERESIS] = s[AMPKIT_RULE_HYSTERESIS] - 1.0;
    }
    next = ampkit_rules_back_off(r, next, overflow && s[AMPKIT_RULE_HYSTERESIS] == 0.0, &scaler_stops);
    const int clean = runs && !bad;
    if (clean) s[AMPKIT_RULE_GROWTH] = s[AMPKIT_RULE_GROWTH] + 1.0;
    const int grows = clean && s[AMPKIT_RULE_GROWTH] == r->growth_interval;
    const float grown = ampkit_rules_times(next, r->growth_factor);
    if (grows && AMPKIT_ISFINITE(grown)) next = grown < r->max_scale ? grown : r->max_scale;
    if (grows) {
      s[AMPKIT_RULE_GROWTH] = 0.0;
      s[AMPKIT_RULE_HYSTERESIS] = r->hysteresis;
    }
  }
  abort = abort || scaler_stops;
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
