// The Trainer's deferred step (trainer.h, deferred_step.h): the iteration of
// Trainer::step with its decisions made on the device and its records delivered one step late.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/deferred_step.h"
#include "ampkit/error.h"
#include "ampkit/step_values_carrier.h"
#include "ampkit/trainer.h"

namespace ampkit {

namespace {

// `t` on the host, its copy queued behind the work queued so far (pinned, without waiting, on a
// GPU): the step's record, queued after it, is waited for before either is read.
at::Tensor copy_behind(const at::Tensor& t) {
  if (t.is_cpu()) return t.clone();  // with gradient_as_bucket_view the next step reuses the bucket
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

}  // namespace

std::string Trainer::enable_deferred_step(std::string& kind, bool tensor_norms) {
  kind.clear();
  if (!folds_unscale())
    return "the optimizer does not take grad_scale and found_inf on the device (FusedAdamW does)";
  if (strategies_.comm->world_size() > 1 && !carrier_)
    return "with several ranks the deferred step needs the Reducer's gradient buckets (a comm backend "
           "with a c10d process group)";
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
  average_across_ranks();  // 3: the Reducer's buckets (several ranks) carried the values: no read
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

// A delivered record as step() returns it: its learning rate, every rank's values (decoded on
// the host as step() decodes them, and their mean loss checked against the device's), the
// optimizer's step counts, and the learning rate of the next step (the schedule counts steps taken).
StepOutcome Trainer::delivered(StepOutcome out) {
  if (deferred_pending_.empty()) throw Error(ErrorCategory::internal, "a deferred record without its step");
  const DeferredPending step = std::move(deferred_pending_.front());
  deferred_pending_.pop_front();
  out.lr = step.lr;
  if (step.rank_values.defined()) out.rank_values = ranks_delivered(step, out.stats);
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
  DeferredPending next;
  at::Tensor loss = step_loss_.reshape({});
  if (carrier_) {  // several ranks: the mean of every rank's loss, decoded on the device
    loss = carrier_->mean_loss(step_values_);
    next.rank_values = copy_behind(step_values_);  // before the record's copy, which waits for both
    next.row_length = row_length_;
  }
  const DeferredGradients g = deferred_->after_backward(*table_, loss);
  next.lr = scheduled_lr();
  deferred_pending_.push_back(next);
  set_lr(next.lr);
  unscaling_->step_deferred(g.grad_scale, g.found_inf);
}

// Every rank's values of a delivered multi-rank step (its copy has arrived: deliver waited for the
// record queued after it), without their losses; their mean must be the loss the device decided on.
std::vector<double> Trainer::ranks_delivered(const DeferredPending& step, const StepStats& stats) const {
  const at::Tensor pieces = step.rank_values.to(at::kDouble).contiguous();
  const double* p = pieces.data_ptr<double>();
  std::vector<double> values = carrier_->decode(std::vector<double>(p, p + pieces.numel()), step.row_length);
  const int ranks = carrier_->world();
  double sum = 0.0;
  for (int r = 0; r < ranks; ++r) sum += values.at(static_cast<size_t>(r * step.row_length));
  const double host = sum / ranks;
  if (std::memcmp(&host, &stats.loss, sizeof host) != 0 && !(std::isnan(host) && std::isnan(stats.loss))) {
    char text[200];
    std::snprintf(
        text, sizeof text,
        "deferred step %lld: the ranks' mean loss decoded on the device is %.17g, on the host %.17g",
        static_cast<long long>(stats.step), stats.loss, host);
    throw Error(ErrorCategory::internal, text);
  }
  return rank_values_of(std::move(values), ranks);
}

std::vector<StepOutcome> Trainer::settle() {
  std::vector<StepOutcome> out;
  if (!deferred_) return out;
  for (StepOutcome& o : deferred_->deliver(/*wait=*/true)) out.push_back(delivered(std::move(o)));
  return out;
}

}  // namespace ampkit
