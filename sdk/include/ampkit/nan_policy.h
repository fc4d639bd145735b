// Interface of NaN policy plugins: what to do with a step whose loss or gradients are bad.
#pragma once

#include <ampkit/strategy.h>

namespace ampkit {

// decide() sees every step (healthy ones too, so it can track spikes and count streaks) and
// returns the action. Every rank sees identical StepStats, so every rank decides the same.
// An abort decision stops the run with the policy's reason in the report and a documented
// exit code.
class AMPKIT_INTERFACE NanPolicy : public Strategy {
 public:
  virtual NanDecision decide(const StepStats& stats) = 0;
};

}  // namespace ampkit
