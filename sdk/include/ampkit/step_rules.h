/* The built-in step rules, each written once: the dynamic loss scaler's update and extra backoff,
   the norm clipper's coefficient and the NaN policies' fate of a non-finite step, as small
   functions over plain numbers. The plugins' host forms (plugins/scaler/dynamic,
   plugins/clipper/norm, plugins/nan_policy/{skip,backoff,abort}) call them; the deferred step runs
   the same lines for CPU tensors and, compiled by nvcc, in its one-thread rules kernel
   (core/engine/src/cuda/step_rules_abi.h). So what the CPU tests prove bit for bit is what a GPU
   runs. Plain C (no ATen; C++ takes <cmath> only, C <math.h>), __host__ __device__ under nvcc.
   Every value is rounded as torch.amp.GradScaler and clip_grad_norm_ round it: products and
   quotients in float64, scales in float32 (float(double(scale) * factor)); no expression adds a
   product to anything, so no compiler contracts one into a fused multiply-add. A third party may
   call these from its own host form and device rule alike. */
#ifndef AMPKIT_STEP_RULES_H
#define AMPKIT_STEP_RULES_H

#ifdef __CUDACC__
#define AMPKIT_STEP_RULE_FN __host__ __device__ inline
#define AMPKIT_ISFINITE(x) isfinite(x)
#define AMPKIT_ISNAN(x) isnan(x)
#define AMPKIT_SQRT(x) sqrt(x)
#elif defined(__cplusplus)
#include <cmath>
#define AMPKIT_STEP_RULE_FN inline
#define AMPKIT_ISFINITE(x) std::isfinite(x)
#define AMPKIT_ISNAN(x) std::isnan(x)
#define AMPKIT_SQRT(x) std::sqrt(x)
#else
#include <math.h>
#define AMPKIT_STEP_RULE_FN static inline
#define AMPKIT_ISFINITE(x) isfinite(x)
#define AMPKIT_ISNAN(x) isnan(x)
#define AMPKIT_SQRT(x) sqrt(x)
#endif

/* Scaler 'dynamic': torch's rule with Megatron's hysteresis, the bounds, and DeepSpeed's stop at
   the minimum (ScalerDeviceRule in device_rules.h declares the same numbers). */
typedef struct {
  double growth_factor;
  double backoff_factor;
  long long growth_interval;
  long long hysteresis;
  long long growth_delay; /* the growth count restarts at -growth_delay, except after a growth */
  float min_scale;
  float max_scale;
  int abort_at_min_scale;
} ampkit_dynamic_scaler_rule;

/* What the dynamic scaler carries from step to step (its save(): scale, growth_tracker,
   hysteresis_tracker). */
typedef struct {
  float scale;
  long long growth_tracker;
  long long hysteresis_tracker;
} ampkit_dynamic_scaler_state;

/* float(double(scale) * factor): GradScaler's rounding of a scale times a factor. */
AMPKIT_STEP_RULE_FN float ampkit_scale_times(float scale, double factor) {
  return (float)((double)scale * factor);
}

/* One backoff: max(float(scale * backoff_factor), min_scale). Asked for while the scale is already
   min_scale with abort_at_min_scale, the scale stays and this returns 1: the run stops (even that
   scale overflows, which scaling cannot fix). */
AMPKIT_STEP_RULE_FN int ampkit_dynamic_scaler_back_off(const ampkit_dynamic_scaler_rule* r,
                                                       ampkit_dynamic_scaler_state* s) {
  if (r->abort_at_min_scale && s->scale <= r->min_scale) return 1;
  const float reduced = ampkit_scale_times(s->scale, r->backoff_factor);
  s->scale = reduced > r->min_scale ? reduced : r->min_scale;
  return 0;
}

/* A NaN policy's extra backoff (skip_backoff): the growth count restarts and the scale backs off
   once, whatever the hysteresis says. 1: the run stops (ampkit_dynamic_scaler_back_off). */
AMPKIT_STEP_RULE_FN int ampkit_dynamic_scaler_backoff(const ampkit_dynamic_scaler_rule* r,
                                                      ampkit_dynamic_scaler_state* s) {
  s->growth_tracker = -r->growth_delay;
  return ampkit_dynamic_scaler_back_off(r, s);
}

/* The update after a step. An overflow (found_inf) restarts the growth count and spends one unit
   of the hysteresis budget; the scale backs off when it is spent (Megatron lets its tracker go
   negative; only reaching 0 matters, so this one stops there). A clean step counts first, as
   torch's _amp_update_scale_ does; at growth_interval the scale becomes
   min(float(scale * growth_factor), max_scale), kept where that product is not finite, the count
   restarts at 0 and the budget is restored (even where the growth was refused). 1: the run stops
   (ampkit_dynamic_scaler_back_off). */
AMPKIT_STEP_RULE_FN int ampkit_dynamic_scaler_update(const ampkit_dynamic_scaler_rule* r,
                                                     ampkit_dynamic_scaler_state* s, int found_inf) {
  if (found_inf) {
    s->growth_tracker = -r->growth_delay;
    if (s->hysteresis_tracker > 0) s->hysteresis_tracker = s->hysteresis_tracker - 1;
    return s->hysteresis_tracker == 0 ? ampkit_dynamic_scaler_back_off(r, s) : 0;
  }
  s->growth_tracker = s->growth_tracker + 1;
  if (s->growth_tracker == r->growth_interval) {
    const float grown = ampkit_scale_times(s->scale, r->growth_factor);
    if (AMPKIT_ISFINITE(grown)) s->scale = grown < r->max_scale ? grown : r->max_scale;
    s->growth_tracker = 0;
    s->hysteresis_tracker = r->hysteresis;
  }
  return 0;
}

/* Clipper 'norm': clip_grad_norm_'s coefficient from the unscaled total norm (L2, or the largest
   |gradient| for the inf norm): max_norm / (total + 1e-6), at most 1 (1 where that is NaN). */
AMPKIT_STEP_RULE_FN double ampkit_norm_clip_coefficient(double max_norm, double total) {
  const double coefficient = max_norm / (total + 1e-6);
  return coefficient < 1.0 ? coefficient : 1.0;
}

/* A NaN policy's rule (NanPolicyDeviceRule in device_rules.h): a bad step is skipped; the flags say
   what else it does. */
typedef struct {
  int backoff; /* a non-finite step also asks the scaler for one more backoff */
  int abort_on_nonfinite_loss;
  int abort_on_nonfinite_gradients; /* (with a finite loss) */
  long long max_consecutive;        /* abort at this many bad steps in a row; 0: never */
} ampkit_nan_policy_rule;

/* What a step becomes (NanAction's proceed, skip, skip_backoff, abort). */
enum { AMPKIT_STEP_PROCEED, AMPKIT_STEP_SKIP, AMPKIT_STEP_SKIP_BACKOFF, AMPKIT_STEP_ABORT };

/* Whether a bad step after `consecutive` bad ones in a row reaches the streak limit. */
AMPKIT_STEP_RULE_FN int ampkit_nan_policy_streak_ends(long long max_consecutive, long long consecutive) {
  return max_consecutive > 0 && consecutive + 1 >= max_consecutive;
}

/* The fate of a step with a non-finite loss (loss_bad) or non-finite gradients (grads_bad), or a
   finite spike the policy's own detector found (spike: skipped, never backed off for, counted in
   the streak; a device rule has none). */
AMPKIT_STEP_RULE_FN int ampkit_nan_policy_decide(const ampkit_nan_policy_rule* r, int loss_bad, int grads_bad,
                                                 int spike, long long consecutive) {
  if (!loss_bad && !grads_bad && !spike) return AMPKIT_STEP_PROCEED;
  if ((r->abort_on_nonfinite_loss && loss_bad) ||
      (r->abort_on_nonfinite_gradients && grads_bad && !loss_bad) ||
      ampkit_nan_policy_streak_ends(r->max_consecutive, consecutive))
    return AMPKIT_STEP_ABORT;
  return r->backoff && (loss_bad || grads_bad) ? AMPKIT_STEP_SKIP_BACKOFF : AMPKIT_STEP_SKIP;
}

#endif
