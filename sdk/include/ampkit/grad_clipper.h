// Interface of gradient clipper plugins: a coefficient from statistics of UNSCALED gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/layout.h>
#include <ampkit/strategy.h>

#include <vector>

namespace ampkit {

struct ClipResult {
  double coefficient = 1.0;  // unscaled gradients are multiplied by this, in (0, 1] (1: no clip)
  double threshold = 0.0;    // the threshold in force this step (for metrics), 0 if none
};

// A clipper never sees scaled gradients: StepStats::grad_norm, grad_max_abs and tensor_norms are
// already divided by the loss scale, and the engine applies `coefficient / scale` in the same
// multiply that unscales. clip() is only called on steps that the optimizer will take.
class AMPKIT_INTERFACE GradClipper : public Strategy {
 public:
  virtual ClipResult clip(const StepStats& stats) = 0;

  // Clippers whose rule is not one global coefficient (clip_grad_value_, unit-wise AGC) need the
  // gradient tensors themselves. Return true to have clip_unscaled_gradients() called; it costs
  // one extra pass over the gradients, which global-coefficient clippers never pay.
  virtual bool clips_elementwise() const { return false; }

  // Called only when clips_elementwise() is true, right after clip() and the single
  // unscale-and-clip multiply of the same step, so only on steps the optimizer takes.
  // `unscaled_grads[i]` is the gradient of `parameters[i]`, already divided by the loss scale
  // (and multiplied by clip()'s coefficient); undefined where a parameter has no gradient. Modify
  // the gradients in place. `parameters` are detached views of the weights (their `.grad()` is
  // undefined), so no handle a clipper may keep leads to the scaled gradients of a later step.
  // Returns, for the metrics only, the L2 norm of the gradients after this call divided by the norm
  // before it: 1 when nothing changed, < 1 when something was clipped. The engine does not apply it.
  virtual double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                         const std::vector<at::Tensor>& unscaled_grads) {
    (void)parameters;
    (void)unscaled_grads;
    return 1.0;
  }
};

// AMPKIT_PLUGIN(clipper, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using clipper = GradClipper;
}

namespace detail {
template <>
struct KindLayout<GradClipper> {
  static constexpr void add(LayoutText& t) {
    t.type("ClipResult", sizeof(ClipResult),
           {offsetof(ClipResult, coefficient), offsetof(ClipResult, threshold)});
    t.type("Tensor", sizeof(at::Tensor), {});
  }
};
}  // namespace detail

}  // namespace ampkit
