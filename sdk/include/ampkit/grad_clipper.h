// Interface of gradient clipper plugins: a coefficient from statistics of UNSCALED gradients.
#pragma once

#include <ampkit/strategy.h>

namespace ampkit {

struct ClipResult {
  double coefficient = 1.0;  // the unscaled gradients are multiplied by this (<= 1 clips)
  double threshold = 0.0;    // the threshold in force this step (for metrics), 0 if none
};

// A clipper never sees scaled gradients: StepStats::grad_norm, grad_max_abs and tensor_norms are
// already divided by the loss scale, and the engine applies `coefficient / scale` in the same
// multiply that unscales. clip() is only called on steps that the optimizer will take.
class AMPKIT_INTERFACE GradClipper : public Strategy {
 public:
  virtual ClipResult clip(const StepStats& stats) = 0;
};

}  // namespace ampkit
