// ampkit.GradScaler's C++ side, its deferred step (scaler_core.h; core/engine/include/ampkit/
// deferred_step.h): made for one optimizer's table, its records delivered, and taken over by the
// host forms where the state changes inside an iteration.
#include <algorithm>
#include <utility>
#include <vector>

#include "ampkit/device_waits.h"
#include "ampkit/error.h"
#include "errors.h"
#include "scaler_core.h"

namespace ampkit::python {

void ScalerCore::settle() {
  if (!deferred_) return;
  const std::vector<StepOutcome> delivered = deferred_->deliver(
      /*wait=*/true, deferred_open_ ? DeferredStep::Newest::open : DeferredStep::Newest::deliver);
  drop_deferred();
  raise_if_aborted(delivered);
}

void ScalerCore::drop_deferred() {
  // A CUDA graph holds the addresses of its step's tensors: they stay allocated, and a replay after
  // this is caught by the next deliver(true).
  if (deferred_ && deferred_->in_graph()) retired_graph_steps_.push_back(std::move(deferred_));
  deferred_.reset();
  deferred_slot_ = -1;
  deferred_open_ = false;
}

void ScalerCore::raise_pending_abort() {
  if (pending_abort_.empty()) return;
  const std::string reason = std::move(pending_abort_);
  pending_abort_.clear();
  throw TrainingAborted(reason);
}

void ScalerCore::raise_if_aborted(const std::vector<StepOutcome>& delivered) {
  for (const StepOutcome& o : delivered)
    if (o.decision.action == NanAction::abort) {
      drop_deferred();
      abort_training(o);
    }
}

void ScalerCore::abort_training(const StepOutcome& aborted) const {
  const std::string kind = aborted.aborted_by_scaler ? "scaler" : "nan_policy";
  const std::string named = kind + " '" + set_->selected(kind).plugin->info().name + "'";
  const std::string& reason = aborted.decision.reason;
  const std::string at_step = "at step " + std::to_string(aborted.stats.step) + ": ";
  // The dynamic scaler's own text already starts with its name ("loss scaler: scaler 'dynamic': ..").
  if (reason.find(named + ":") != std::string::npos)
    throw TrainingAborted("training aborted " + at_step + reason);
  throw TrainingAborted(named + " aborted training " + at_step + reason);
}

void ScalerCore::set_late_arrivals(bool on) {
  locked([&] {
    late_arrivals_ = on;
    if (deferred_) deferred_->set_late_arrivals(on);
  });
}

std::string ScalerCore::prepare_deferred(int64_t slot) {
  return locked([&] {
    if (deferred_ && deferred_slot_ == slot) return std::string();
    settle();
    GradientTable& t = table(slot);
    if (!step_->started()) step_->start(run_info(t));
    std::string kind, why;
    deferred_ = DeferredStep::make(*step_, t, kind, why);
    if (!deferred_) return kind.empty() ? why : kind + " '" + plugin(kind).at(0) + "' " + why;
    deferred_->allow_graphs();  // torch.cuda.graph may capture a GradScaler's step
    deferred_->set_late_arrivals(late_arrivals_);
    deferred_slot_ = slot;
    return std::string();
  });
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> ScalerCore::unscale_deferred(
    int64_t slot, std::optional<at::Tensor> loss, bool capturing) {
  using Decided = std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>>;
  return locked([&]() -> Decided {
    if (!deferred_ || deferred_slot_ != slot)
      throw Error(ErrorCategory::internal, "unscale_deferred before prepare_deferred for this optimizer");
    GradientTable& t = table(slot);
    bool any = false;
    for (const at::Tensor& g : read_gradients(slot)) {  // fp16 ones too: the fused optimizer unscales
      if (!g.defined()) continue;
      any = true;
      check_real(g);
      if (g.is_sparse())
        throw Error(ErrorCategory::usage,
                    "the deferred step takes no sparse gradients: create the GradScaler with sync='step'");
    }
    // Without gradients nothing is recorded, as in unscale(): the fused optimizer steps over none,
    // and update() with nothing else recorded raises as torch's does.
    if (!any && !t.reduces()) return std::nullopt;
    const DeferredGradients g = deferred_->after_backward(t, loss ? *loss : at::Tensor(), capturing);
    last_table_ = tables_.at(slot);
    if (capturing &&
        std::find(graph_tables_.begin(), graph_tables_.end(), last_table_) == graph_tables_.end())
      graph_tables_.push_back(tables_.at(slot));
    deferred_open_ = !capturing;  // a captured iteration runs whole at each replay
    return std::make_tuple(g.grad_scale, g.found_inf, g.stepped);
  });
}

at::Tensor ScalerCore::device_scale() const {
  return locked([&] { return deferred_ ? deferred_->scale() : at::Tensor(); });
}

int64_t ScalerCore::deliver(bool wait) {
  return locked([&] {
    raise_pending_abort();
    // One wait for the device, then every step's count and rows as of that moment: a wait per
    // step captured before a state change would stall every stream again for each of them.
    const DeviceWaitScope one_wait;
    if (wait)
      for (const auto& retired : retired_graph_steps_)
        if (retired->unread_rows() > 0)
          throw Error(ErrorCategory::usage,
                      "a CUDA graph captured before the scaler's state was replaced (load_state_dict, "
                      "update(new_scale), an option set) was replayed after it, and stepped the old state: "
                      "capture the graph again after such a change");
    if (!deferred_) return int64_t{0};
    const std::vector<StepOutcome> delivered =
        deferred_open_ ? deferred_->deliver(/*wait=*/true, DeferredStep::Newest::hold)
                       : deferred_->deliver(wait);
    raise_if_aborted(delivered);
    return static_cast<int64_t>(delivered.size());
  });
}

void ScalerCore::settle_iteration() {
  locked([&] {
    raise_pending_abort();
    if (deferred_open_) settle();
  });
}

int64_t ScalerCore::end_deferred_iteration() {
  return locked([&] {
    raise_pending_abort();
    if (deferred_open_) {
      deferred_open_ = false;
      const std::vector<StepOutcome> delivered = deferred_->deliver(/*wait=*/false);
      raise_if_aborted(delivered);
      return static_cast<int64_t>(delivered.size());
    }
    if (step_->iteration_size() == 0) return int64_t{0};  // dropped with an abort before it
    const StepOutcome merged = step_->finish_iteration();
    if (merged.decision.action == NanAction::abort) abort_training(merged);
    return int64_t{1};
  });
}

}  // namespace ampkit::python
