// ampkit.GradScaler's C++ side: plugins chosen by name and the AMP step around a Python optimizer.
#include "scaler_core.h"

#include <ATen/core/List.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "ampkit/metrics.h"
#include "ampkit/outcome_record.h"
#include "ampkit/plugin_options.h"
#include "errors.h"
#include "facts.h"
#include "group_reduction.h"
#include "ivalues.h"
#include "plugin_listing.h"

namespace ampkit::python {

namespace {

// Where a GradScaler's option values come from, in sources and messages (never "command line").
constexpr const char* kOptionSource = "ampkit.GradScaler";

// plugin_timeout: seconds (ampkit-train's --plugin-timeout), or -1 for None (no limit: 0).
unsigned checked_timeout(int64_t seconds) {
  if (seconds == -1) return 0;
  if (seconds < 1 || seconds > 86400)
    throw Error(ErrorCategory::usage,
                "plugin_timeout must be a number of seconds from 1 to 86400, or None for "
                "no limit; got " +
                    std::to_string(seconds));
  return static_cast<unsigned>(seconds);
}

}  // namespace

ScalerCore::ScalerCore(c10::Dict<std::string, std::string> plugins,
                       c10::Dict<std::string, std::string> options, std::string precision,
                       std::vector<std::string> plugin_dirs, bool allow_untrusted, bool cuda, int64_t rank,
                       int64_t world_size, std::string stats_recipe, int64_t plugin_timeout) {
  locked([&] {
    recipe_ = parse_stats_recipe(stats_recipe);
    const unsigned timeout = checked_timeout(plugin_timeout);
    std::map<std::string, StrategyChoice> choices;
    for (const char* kind : kStepKinds) choices[kind] = StrategyChoice{};
    for (const auto& entry : plugins) {
      check_step_kind(entry.key());
      if (entry.value().empty())  // not the kind's default: an empty name is a mistake
        throw Error(ErrorCategory::usage, entry.key() + "='' names no plugin: give a plugin name or a path");
      choices[entry.key()].name = entry.value();
    }
    for (const auto& entry : options) {
      const std::string& key = entry.key();
      const size_t dot = key.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == key.size())
        throw Error(ErrorCategory::usage,
                    "option '" + key + "' is not of the form KIND.OPTION (e.g. clipper.max_norm)");
      check_step_kind(key.substr(0, dot));
      choices[key.substr(0, dot)].options.command_line[key.substr(dot + 1)] = entry.value();
    }
    info_.precision = precision_from(precision);
    info_.cuda = cuda;
    info_.rank = static_cast<int>(rank);
    info_.world_size = static_cast<int>(world_size);
    for (auto& [kind, choice] : choices) {
      if (choice.name.empty()) choice.name = default_plugin(kind);
      choice.options.precision = info_.precision;
      choice.options.command_line_name = kOptionSource;
    }
    choices["comm"] = StrategyChoice{"local", {}};
    registry_ = std::make_unique<Registry>(registry_options(plugin_dirs, allow_untrusted, timeout));
    set_ = StrategySet::load(*registry_, choices);
    set_->create(timeout);  // the constructors, and every later scaler, clipper and policy call
    if (set_->nan_policy().rollback_plan().enabled())
      throw Error(ErrorCategory::usage,
                  "NaN policy '" + set_->selected("nan_policy").plugin->info().name +
                      "' rolls back to a snapshot of the model, which ampkit.GradScaler does not hold; use "
                      "nan_policy 'skip', 'backoff' or 'abort'");
    step_ = std::make_unique<AmpStep>(AmpStrategies{&set_->scaler(), &set_->clipper(), &set_->nan_policy()});
  });
}

double ScalerCore::scale() const {
  return locked([&] { return step_->scale(); });
}

std::tuple<std::string, std::string> ScalerCore::bind(int64_t slot, std::vector<at::Tensor> parameters,
                                                      std::vector<std::string> names) {
  return locked([&] {
    if (names.size() != parameters.size())
      throw Error(ErrorCategory::internal, "bind: parameters and names differ in count");
    auto table = std::make_shared<GradientTable>(std::move(parameters), std::move(names), recipe_);
    auto chosen = std::make_tuple(std::string(to_string(table->recipe())), table->recipe_fallback());
    tables_[slot] = std::move(table);
    return chosen;
  });
}

void ScalerCore::reduce_across(int64_t slot, const std::string& group_name, bool sharded) {
  locked([&] {
    table(slot).set_reduction(
        group_name.empty()
            ? nullptr
            : make_group_reduction(group_name, sharded ? GradientLayout::shards : GradientLayout::replicas));
  });
}

void ScalerCore::set_gradients(int64_t slot, std::vector<std::optional<at::Tensor>> gradients) {
  locked([&] {
    if (gradients.size() != table(slot).parameters().size())
      throw Error(ErrorCategory::internal, "set_gradients: gradients and bound parameters differ in count");
    given_gradients_[slot] = std::move(gradients);
  });
}

void check_real(const at::Tensor& gradient) {
  if (at::isComplexType(gradient.scalar_type()))
    throw Error(ErrorCategory::usage,
                std::string("a ") + c10::toString(gradient.scalar_type()) +
                    " gradient: ampkit.GradScaler unscales real floating-point gradients "
                    "(torch.amp.GradScaler takes no complex ones either)");
}

const std::vector<at::Tensor>& ScalerCore::read_gradients(int64_t slot) {
  GradientTable& t = table(slot);
  const std::vector<at::Tensor>& grads = t.read_gradients();
  const auto given = given_gradients_.find(slot);
  if (given == given_gradients_.end()) return grads;
  for (size_t i = 0; i < given->second.size(); ++i)
    t.replace_gradient(i, given->second[i] ? *given->second[i] : at::Tensor());
  given_gradients_.erase(given);
  return grads;
}

RunInfo ScalerCore::run_info(const GradientTable& table) const {
  RunInfo info = info_;
  info.parameter_names = table.names();
  return info;
}

GradientTable& ScalerCore::table(int64_t slot) {
  const auto found = tables_.find(slot);
  if (found == tables_.end()) throw Error(ErrorCategory::internal, "no parameters bound to this optimizer");
  return *found->second;
}

void ScalerCore::unbind(int64_t slot) {
  locked([&] {
    if (slot == deferred_slot_) {
      try {  // from a finalizer, which raises nothing: the next update() or host read does
        settle();
      } catch (const TrainingAborted& e) {
        pending_abort_ = e.what();
      }
    }
    const auto found = tables_.find(slot);
    if (found == tables_.end()) return;
    if (last_table_ == found->second) last_table_.reset();  // last_step names no gradients then
    tables_.erase(found);
    given_gradients_.erase(slot);
  });
}

std::tuple<bool, bool, double> ScalerCore::unscale(int64_t slot, bool fold, std::optional<at::Tensor> loss) {
  return locked([&] {
    settle();  // deferred steps' records first (this iteration's one joins it: a second optimizer)
    const auto found = tables_.find(slot);
    if (found == tables_.end())
      throw Error(ErrorCategory::internal, "unscale: no parameters bound to this optimizer");
    GradientTable& table = *found->second;
    const std::vector<at::Tensor>& grads = read_gradients(slot);
    // torch.amp.GradScaler's checks on what it unscales: no fp16 gradients; a sparse gradient is
    // coalesced (duplicates summed before the finite check) and its values unscaled in place.
    // A fused optimizer unscales fp16 gradients itself (torch's GradScaler lets it), unless an
    // element-wise clipper needs them unscaled here.
    const bool in_place = !fold || set_->clipper().clips_elementwise();
    bool any = false;
    for (size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor& g = grads[i];
      if (!g.defined()) continue;
      any = true;
      check_real(g);
      if (in_place && g.scalar_type() == at::kHalf)
        throw Error(ErrorCategory::usage, "Attempting to unscale FP16 gradients.");
      if (g.is_sparse()) {
        const at::Tensor coalesced = g.coalesce();
        table.parameters()[i].mutable_grad() = coalesced;
        table.replace_gradient(i, coalesced._values());
        fold = false;
      }
    }
    // Without gradients nothing is recorded (torch: "No inf checks were recorded"), unless the
    // table reduces across ranks: then this rank joins the collective the others wait in, and takes
    // the group's decision (it has nothing to step) where another rank had gradients.
    if (!any && !table.reduces()) return std::make_tuple(false, false, 1.0);
    if (!step_->started()) step_->start(run_info(table));
    StepOutcome out = step_->begin_iteration();  // the same scale and step for every optimizer
    const at::Tensor device_loss = loss ? *loss : at::Tensor();  // read with the statistics
    const double factor =
        step_->after_backward({table, fold, SkippedGradients::unscale, device_loss, nullptr}, out);
    last_table_ = found->second;
    // No rank had a gradient (FSDP2 with gradient sync left off, modules no rank used): torch
    // records no inf check, so neither is this, and step() (update() for a fused optimizer alone)
    // raises as torch's, on every rank. The outcome left in the iteration adds nothing to it (no
    // elements, finite, stepped) should the caller go on.
    if (!any && out.stats.grad_elements == 0) return std::make_tuple(false, false, 1.0);
    return std::make_tuple(true, out.stepped, factor);
  });
}

double ScalerCore::update() {
  return locked([&] {
    raise_pending_abort();
    const StepOutcome merged = step_->finish_iteration();
    if (merged.decision.action == NanAction::abort) abort_training(merged);
    return merged.scale_next;
  });
}

void ScalerCore::set_scale(double scale) {
  locked([&] {
    if (!(scale > 0.0) || !std::isfinite(scale))
      throw Error(ErrorCategory::usage,
                  "new_scale must be a positive finite number, got " + format_number(scale));
    if (!strategy("scaler").save().has("scale"))
      throw Error(ErrorCategory::usage,
                  "scaler '" + plugin("scaler").at(0) +
                      "' keeps no scale in its state, so update(new_scale) cannot set it");
    settle();  // a deferred iteration is finished here, with the scale given (no scaler update)
    step_->finish_iteration_with_scale(scale);
  });
}

std::string ScalerCore::option(const std::string& kind, const std::string& name) const {
  return locked([&] {
    check_step_kind(kind);
    for (const auto& s : set_->selected(kind).options.settings)
      if (s.name == name) return s.value;
    throw Error(ErrorCategory::usage, plugin(kind).at(0) + " has no option '" + name + "'");
  });
}

void ScalerCore::set_option(const std::string& kind, const std::string& name, const std::string& value) {
  locked([&] {
    check_step_kind(kind);
    settle();
    OptionInputs inputs;
    for (const auto& setting : set_->selected(kind).options.settings)
      if (setting.source != "default" && setting.set && setting.source.rfind("default for", 0) != 0)
        inputs.command_line[setting.name] = setting.value;
    inputs.command_line[name] = value;
    inputs.command_line_name = kOptionSource;
    inputs.precision = info_.precision;
    std::optional<RunInfo> started;
    if (step_->started()) started = last_table_ ? run_info(*last_table_) : info_;
    set_->reconfigure(kind, inputs, started ? &*started : nullptr);
    step_->set_strategies({&set_->scaler(), &set_->clipper(), &set_->nan_policy()});
  });
}

std::vector<std::vector<std::string>> ScalerCore::settings(const std::string& kind) const {
  return locked([&] {
    check_step_kind(kind);
    std::vector<std::vector<std::string>> rows;
    for (const auto& s : set_->selected(kind).options.settings) rows.push_back({s.name, s.value, s.source});
    return rows;
  });
}

std::vector<std::string> ScalerCore::plugin(const std::string& kind) const {
  return locked([&] {
    check_step_kind(kind);
    const PluginInfo& info = set_->selected(kind).plugin->info();
    return std::vector<std::string>{info.name, info.version,
                                    info.is_static ? std::string() : info.path.string()};
  });
}

Strategy& ScalerCore::strategy(const std::string& kind) const {
  check_step_kind(kind);
  return *set_->selected(kind).strategy;
}

c10::Dict<std::string, c10::IValue> ScalerCore::state(const std::string& kind) const {
  return locked([&] {
    c10::Dict<std::string, c10::IValue> out = any_dict();
    const State s = strategy(kind).save();  // a guarded strategy: a plugin call (plugin_call.h)
    for (const auto& [key, value] : s.values()) out.insert(key, to_ivalue(value));
    return out;
  });
}

void ScalerCore::load_state(const std::string& kind, c10::Dict<std::string, c10::IValue> state) {
  locked([&] {
    settle();
    State s;
    for (const auto& entry : state) {
      const StateValue v = from_ivalue(entry.key(), entry.value());
      std::visit([&](const auto& x) { s.set(entry.key(), x); }, v);
    }
    try {
      strategy(kind).load(s);  // a guarded strategy: a plugin call
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCategory::checkpoint,
                  kind + " '" + plugin(kind).at(0) + "' cannot load this state: " + e.what());
    }
  });
}

c10::Dict<std::string, c10::IValue> ScalerCore::record() const {
  return locked([&] {
    const StepOutcome& o = step_->last_outcome();
    StepRecord record = step_record(o, 0, step_->counters().skipped(), 0.0, 0.0);
    const std::vector<std::string> no_names;
    const std::vector<std::string>& names = last_table_ ? last_table_->names() : no_names;
    const bool named = names.size() == o.stats.tensor_norms.size();
    if (named) record.top_layers = top_layers(names, o.stats.tensor_norms, 5);
    c10::Dict<std::string, c10::IValue> r = any_dict();
    record.visit([&](const char* key, const auto& value) { r.insert(key, record_value(value)); },
                 /*host_fields=*/false);
    if (!r.contains("reason")) r.insert("reason", std::string());  // always there for Python callers
    c10::Dict<std::string, c10::IValue> layers = any_dict();
    if (named)
      for (size_t i = 0; i < names.size(); ++i) layers.insert(names[i], o.stats.tensor_norms[i]);
    r.insert("layer_norms", c10::IValue(layers));
    r.insert("stats_recipe",
             std::string(last_table_ ? to_string(last_table_->recipe()) : to_string(recipe_)));
    return r;
  });
}

}  // namespace ampkit::python
