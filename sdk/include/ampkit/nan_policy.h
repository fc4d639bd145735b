// Interface of NaN policy plugins: what to do with a step whose loss or gradients are bad.
#pragma once

#include <ampkit/layout.h>
#include <ampkit/strategy.h>

#include <cstdint>

namespace ampkit {

// What a policy that can roll back needs the host to keep. The host owns the snapshots (the
// policy never sees the model); the policy only says how often and from where.
struct RollbackPlan {
  int64_t snapshot_every = 0;    // optimizer steps taken between in-memory snapshots; 0: none
  bool from_checkpoint = false;  // roll back to the newest on-disk checkpoint instead
  bool enabled() const { return snapshot_every > 0 || from_checkpoint; }
};

// decide() sees every step (healthy ones too, so it can track spikes and count streaks) and
// returns the action. Every rank sees identical StepStats, so every rank decides the same.
// An abort decision stops the run with the policy's reason in the report and a documented
// exit code. A policy that may return NanAction::rollback declares a RollbackPlan; the host
// refuses to start when it cannot honour it (no --checkpoint-dir for from_checkpoint).
class AMPKIT_INTERFACE NanPolicy : public Strategy {
 public:
  virtual NanDecision decide(const StepStats& stats) = 0;
  virtual RollbackPlan rollback_plan() const { return {}; }
};

// AMPKIT_PLUGIN(nan_policy, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using nan_policy = NanPolicy;
}

namespace detail {
template <>
struct KindLayout<NanPolicy> {
  static constexpr void add(LayoutText& t) {
    t.type("RollbackPlan", sizeof(RollbackPlan),
           {offsetof(RollbackPlan, snapshot_every), offsetof(RollbackPlan, from_checkpoint)});
  }
};
}  // namespace detail

}  // namespace ampkit
