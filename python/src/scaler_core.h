// The C++ side of ampkit.GradScaler: the plugins and the AMP step, for a Python optimizer.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ampkit/amp_step.h"
#include "ampkit/deferred_step.h"
#include "ampkit/gradient_table.h"
#include "ampkit/registry.h"
#include "ampkit/strategy_set.h"
#include "errors.h"

namespace ampkit::python {

// torch.amp.GradScaler's check that a gradient is real (its unscale kernels take no complex ones):
// a usage error naming the dtype.
void check_real(const at::Tensor& gradient);

// One GradScaler's strategies (scaler, clipper, NaN policy; loaded by name with the CLI's option
// rules) and its engine, the AmpStep the Trainer runs (core/engine/include/ampkit/amp_step.h).
// Python drives it in torch.amp.GradScaler's order: scale() for the loss, unscale() once per
// optimizer after backward, the optimizer's own step, update() once per iteration. Each optimizer's
// parameters are bound once (bind(), again only when its parameter list changes): the gradient
// table and the statistics recipe are chosen then, so a step's host work does not grow with the
// number of parameters. This class adds only what is Python's: the bindings, torch's checks on
// the gradients, and the record as a dict.
class ScalerCore : public torch::CustomClassHolder {
 public:
  // `plugins`: kind -> plugin name or path (scaler, clipper, nan_policy; missing kinds take their
  // defaults); `options`: "KIND.OPTION" -> text, as --opt; `precision` picks per-precision
  // defaults; `plugin_dirs` are searched before AMPKIT_PLUGIN_PATH; `stats_recipe` is one of
  // grad_stats.h's recipes (automatic: chosen per optimizer from its parameters);
  // `plugin_timeout` bounds the probe, each constructor and each later call, in seconds (0: none).
  ScalerCore(c10::Dict<std::string, std::string> plugins, c10::Dict<std::string, std::string> options,
             std::string precision, std::vector<std::string> plugin_dirs, bool allow_untrusted, bool cuda,
             int64_t rank, int64_t world_size, std::string stats_recipe, int64_t plugin_timeout);

  double scale() const;
  // The parameters of one optimizer (in its param_groups' order) and their names, as table `slot`
  // (a number the caller picks; binding a slot again replaces its table). Returns the recipe
  // chosen for them and, on a GPU where automatic did not take the chunk kernel, why ("" otherwise).
  std::tuple<std::string, std::string> bind(int64_t slot, std::vector<at::Tensor> parameters,
                                            std::vector<std::string> names);
  // Table `slot`'s statistics reduced across the c10d process group `group_name` from now on, before
  // their one read (group_reduction.h): `sharded` for gradients split over the group's ranks
  // (FSDP2), otherwise whole gradients on every rank (DDP). "" reduces nothing.
  void reduce_across(int64_t slot, const std::string& group_name, bool sharded);
  // The gradients table `slot`'s next unscale measures and unscales in place of its parameters'
  // .grad (a sharded parameter's gradient is a DTensor: Python hands its local shard); None where a
  // parameter has none. Used once.
  void set_gradients(int64_t slot, std::vector<std::optional<at::Tensor>> gradients);
  // Statistics, the policy's decision and unscale+clip for the gradients of table `slot`. Returns
  // (recorded: false when no parameter has a gradient, step: whether the optimizer may step,
  // factor: what its fused step still has to multiply the gradients by, 1 when they were
  // multiplied here). `fold`: the optimizer takes grad_scale. `loss`: the iteration's mean
  // unscaled loss when the caller knows it (a non-finite loss is a bad step too, and spike
  // detection reads it); read with the statistics.
  std::tuple<bool, bool, double> unscale(int64_t slot, bool fold, std::optional<at::Tensor> loss);
  // The scaler's update with the iteration's merged statistics; returns the next scale. An
  // iteration whose policy or scaler aborted raises.
  double update();
  // update(new_scale): the scale is set, the scaler's counters are kept (GradScaler's rule).
  void set_scale(double scale);

  // The deferred step (core/engine/include/ampkit/deferred_step.h) for table `slot`: "" when it is
  // ready (made on the first call from the strategies' current state), else why the step stays
  // synchronous, naming the plugin or the recipe.
  std::string prepare_deferred(int64_t slot);
  // After backward, for table `slot`: (grad_scale, found_inf, stepped) for the fused optimizer,
  // computed on the device with no host read; `loss` as unscale()'s. `capturing`: the step is
  // being captured in a CUDA graph (DeferredStep::after_backward). None when
  // the optimizer has no gradient and the table does not reduce: nothing recorded, as unscale().
  std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> unscale_deferred(
      int64_t slot, std::optional<at::Tensor> loss, bool capturing);
  // What the next backward multiplies the loss by in the deferred step (float32 on the device,
  // updated in place; undefined before prepare_deferred succeeded).
  at::Tensor device_scale() const;
  // Delivers the deferred records that have arrived (every one with `wait`) to the strategies;
  // returns how many. Between a deferred step and its update() the step's own record stays
  // undelivered, so the state read is the one before the iteration's update (torch's GradScaler
  // shows that). A delivered step that aborted raises, as update() does, and drops the deferred step
  // (the next one is made from the host forms, which go on as the synchronous step does).
  int64_t deliver(bool wait);
  // update() of an iteration whose step was deferred: the records that have arrived are delivered;
  // an iteration the host forms took over (a state change or a second optimizer between the step and
  // update(): settle()) is finished as update() finishes one. An abort raises, as deliver's.
  int64_t end_deferred_iteration();
  // A read of the step record between a deferred step and its update() (last_step): the
  // iteration's own record is waited for and the host forms take the iteration over (settle()),
  // so the record describes this step while the state stays the one before the update. Nothing
  // when no deferred iteration is open.
  void settle_iteration();
  // Tests: CPU records arrive as late as a GPU's may (DeferredStep::set_late_arrivals).
  void set_late_arrivals(bool on);
  // Forgets table `slot` (its optimizer is gone): its tensors are released. Raises nothing (a
  // finalizer calls it): an abort among the records it delivers is raised by the next update().
  void unbind(int64_t slot);

  // The resolved value of a plugin option ("" when unset), and setting one: the plugin is made
  // again with it (StrategySet::reconfigure: guarded, started, given its saved state).
  std::string option(const std::string& kind, const std::string& name) const;
  void set_option(const std::string& kind, const std::string& name, const std::string& value);
  // Every option of a kind: (name, value, source) rows.
  std::vector<std::vector<std::string>> settings(const std::string& kind) const;
  // name, version and file of the selected plugin of `kind`.
  std::vector<std::string> plugin(const std::string& kind) const;

  // A plugin's checkpointable state as (key, value) with value one of bool, int, float, str,
  // list of float; load_state takes the same, with a float64 tensor for a list (an empty Python
  // list has no element type to cross as).
  c10::Dict<std::string, c10::IValue> state(const std::string& kind) const;
  void load_state(const std::string& kind, c10::Dict<std::string, c10::IValue> state);

  // The last unscale()'s record: ampkit-train's metrics record (StepRecord::visit, without the
  // host's fields), plus layer_norms (every gradient's norm by name) and stats_recipe.
  c10::Dict<std::string, c10::IValue> record() const;
  int64_t steps_in_iteration() const { return static_cast<int64_t>(step_->iteration_size()); }

 private:
  // A method's body: one call at a time on this scaler (a GradScaler shared by threads would race
  // on the engine's state: its methods run with the GIL released), then guarded()'s translation.
  template <class F>
  auto locked(F&& body) const -> decltype(body()) {
    const std::lock_guard<std::recursive_mutex> hold(mutex_);
    return guarded(std::forward<F>(body));
  }
  mutable std::recursive_mutex mutex_;
  Strategy& strategy(const std::string& kind) const;
  RunInfo run_info(const GradientTable& table) const;
  GradientTable& table(int64_t slot);
  // table(slot).read_gradients(), with the gradients set_gradients gave in their place.
  const std::vector<at::Tensor>& read_gradients(int64_t slot);
  // Before the strategies' state changes from outside the step (or a synchronous step joins the
  // iteration): every record delivered, the deferred step dropped (made again from the new state on
  // its next prepare_deferred). A deferred iteration still open is taken over by the host forms
  // (DeferredStep::Newest::open), for update() to finish with the changed state, as torch's does.
  void settle();
  void drop_deferred();
  // Raises TrainingAborted for an aborted record among `delivered`, after dropping the deferred step.
  void raise_if_aborted(const std::vector<StepOutcome>& delivered);
  // An abort unbind() delivered (from a finalizer, which cannot raise), raised by the next update()
  // or host read.
  void raise_pending_abort();
  // TrainingAborted for an aborted outcome, naming the NaN policy or the scaler that stopped the
  // run and its step, as ampkit-train's exit line does (a reason that names its plugin keeps it once).
  [[noreturn]] void abort_training(const StepOutcome& aborted) const;
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<StrategySet> set_;
  std::unique_ptr<AmpStep> step_;
  RunInfo info_;
  DeviceStatsRecipe recipe_ = DeviceStatsRecipe::automatic;
  std::map<int64_t, std::shared_ptr<GradientTable>> tables_;
  std::map<int64_t, std::vector<std::optional<at::Tensor>>> given_gradients_;  // set_gradients
  std::shared_ptr<const GradientTable> last_table_;                            // the last unscale()'s
  std::unique_ptr<DeferredStep> deferred_;
  int64_t deferred_slot_ = -1;
  bool deferred_open_ = false;  // a deferred step ran, its update() has not
  bool late_arrivals_ = false;
  std::string pending_abort_;                                       // raise_pending_abort()
  std::vector<std::unique_ptr<DeferredStep>> retired_graph_steps_;  // settled after a capture (settle())
  // The tables captured steps measured: a replay reads their gradients and writes their buffers, so
  // a rebind or an unbind after a capture leaves them here, alive as long as the steps are.
  std::vector<std::shared_ptr<GradientTable>> graph_tables_;
};

}  // namespace ampkit::python
