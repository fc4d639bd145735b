// Interface of loss scaler plugins: the scale the loss is multiplied by before backward.
#pragma once

#include <ampkit/layout.h>
#include <ampkit/strategy.h>

namespace ampkit {

// The engine multiplies the loss by scale() for every micro-batch of a step, unscales the
// gradients by the same value, and calls update() exactly once per optimizer step — skipped
// steps included — after the optimizer (possibly) stepped. scale() must not change between
// update() calls.
class AMPKIT_INTERFACE LossScaler : public Strategy {
 public:
  virtual double scale() const = 0;
  virtual void update(const StepStats& stats) = 0;
  // A NaN policy asked for one extra reduction (NanAction::skip_backoff). Scalers without a
  // notion of backoff ignore it.
  virtual void backoff() {}
  // True for scalers whose scale changes with overflow (used for precision sanity warnings).
  virtual bool is_dynamic() const { return false; }
};

// AMPKIT_PLUGIN(scaler, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using scaler = LossScaler;
}

}  // namespace ampkit
