// The Trainer's deferred step (issue 42; trainer.h, deferred_step.h): the iteration of
// Trainer::step with its decisions made on the device and its records delivered one step late.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "ampkit/deferred_step.h"
#include "ampkit/error.h"
#include "ampkit/trainer.h"

namespace ampkit {

std::string Trainer::enable_deferred_step(std::string& kind, bool tensor_norms) {
  kind.clear();
  if (!folds_unscale())
    return "the optimizer does not take grad_scale and found_inf on the device (FusedAdamW does)";
  if (strategies_.comm->world_size() > 1) return "the deferred step runs in one process only";
  if (!started_) start(RunInfo{});
  std::string why;
  deferred_ = DeferredStep::make(amp_, *table_, kind, why);
  if (deferred_) deferred_->set_tensor_norms(tensor_norms);
  return deferred_ ? std::string() : why;
}

Trainer::DeferredBackward Trainer::deferred_backward(const std::function<at::Tensor(int)>& forward) {
  if (!deferred_)
    throw Error(ErrorCategory::internal, "Trainer::deferred_backward without the deferred step");
  forward_backward(forward, 0.0, deferred_->scale());  // 1, 2: no host read of the scale
  average_across_ranks();                              // 3: one process; the gradients' table
  DeferredBackward r;
  // The previous step's record: its update and copy were queued before this step's forward.
  for (StepOutcome& out : deferred_->deliver(/*wait=*/true)) {
    r.delivered.push_back(delivered(std::move(out)));
    const StepOutcome& done = r.delivered.back();
    if (!done.stepped && bad_step_observer_ && bad_step_observer_(done, previous_forward_)) r.redo = true;
  }
  previous_forward_ = forward;
  return r;
}

// A delivered record as step() returns it: its learning rate, the optimizer's step counts, and
// the learning rate of the next step (the schedule counts steps taken).
StepOutcome Trainer::delivered(StepOutcome out) {
  if (deferred_lrs_.empty()) throw Error(ErrorCategory::internal, "a deferred record without its step");
  out.lr = deferred_lrs_.front();
  deferred_lrs_.pop_front();
  unscaling_->count_deferred_step(out.stepped);
  if (out.stepped) set_lr(scheduled_lr());
  return out;
}

void Trainer::deferred_update() {
  // deferred_backward delivered every earlier record: after_backward delivers none behind our back.
  if (deferred_->pending() != 0)
    throw Error(ErrorCategory::internal, "Trainer::deferred_update before deferred_backward");
  // 4-6, 8 on the device; 7: the fused optimizer skips where found_inf is 1. The learning rate is
  // set as step() sets it, from the steps taken before this one (all delivered by now).
  const DeferredGradients g = deferred_->after_backward(*table_, step_loss_.reshape({}));
  deferred_lrs_.push_back(scheduled_lr());
  set_lr(deferred_lrs_.back());
  unscaling_->step_deferred(g.grad_scale, g.found_inf);
}

std::vector<StepOutcome> Trainer::settle() {
  std::vector<StepOutcome> out;
  if (!deferred_) return out;
  for (StepOutcome& o : deferred_->deliver(/*wait=*/true)) out.push_back(delivered(std::move(o)));
  return out;
}

}  // namespace ampkit
