// ampkit.GradScaler's C++ side: plugins chosen by name and the AMP step around a Python optimizer.
#include "scaler_core.h"

#include <ATen/core/List.h>

#include <cmath>
#include <filesystem>
#include <utility>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "ampkit/metrics.h"
#include "ampkit/plugin_call.h"
#include "ampkit/plugin_options.h"
#include "errors.h"

namespace ampkit::python {

namespace {

// The kinds a GradScaler uses: data-parallel averaging is torch DDP's in a Python loop.
constexpr const char* kStepKinds[] = {"scaler", "clipper", "nan_policy"};

void check_step_kind(const std::string& kind) {
  for (const char* k : kStepKinds)
    if (kind == k) return;
  if (kind == "comm")
    throw Error(ErrorCategory::usage,
                "plugin kind 'comm' is not used by ampkit.GradScaler: in Python, gradients are averaged "
                "across ranks by torch DDP (see docs/python.md)");
  const std::string hint = did_you_mean(kind, {"scaler", "clipper", "nan_policy"});
  throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind +
                                        "' (kinds: scaler, clipper, nan_policy)" +
                                        (hint.empty() ? "" : "; " + hint));
}

Precision precision_from(const std::string& text) {
  if (const std::optional<Precision> p = parse_precision(text)) return *p;
  std::vector<std::string> names;
  for (const Precision p : kPrecisions) names.emplace_back(to_string(p));
  const std::string hint = did_you_mean(text, names);
  throw Error(ErrorCategory::usage, "precision '" + text + "' is not one of " + precision_names(", ") +
                                        (hint.empty() ? "" : "; " + hint));
}

RegistryOptions registry_options(const std::vector<std::string>& dirs, bool allow_untrusted) {
  RegistryOptions o;
  for (const auto& d : dirs) o.plugin_dirs.emplace_back(d);
  o.allow_untrusted = allow_untrusted;
  o.plugin_dirs_name = "plugin_dirs folder";
  o.allow_untrusted_name = "allow_untrusted_plugins=True";
  o.use_default_dirs = false;  // the Python package names its own plugin folder in `dirs`
  // The crash probe forks; a fork of a threaded process (Python with torch's thread pools) may
  // only run async-signal-safe code until exec, which dlopen and static initializers are not.
  o.probe = false;
  return o;
}

// A str -> Any dict, as Python sees a dict of mixed values.
c10::Dict<std::string, c10::IValue> any_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

c10::IValue to_ivalue(const StateValue& v) {
  return std::visit(
      [](const auto& x) -> c10::IValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::vector<double>>)
          return c10::IValue(c10::List<double>(x));
        else
          return c10::IValue(x);
      },
      v);
}

StateValue from_ivalue(const std::string& key, const c10::IValue& v) {
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  if (v.isDoubleList()) return v.toDoubleVector();
  if (v.isTensor()) {
    const at::Tensor t = v.toTensor().to(at::kDouble).contiguous().reshape({-1});
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  if (v.isList()) {
    std::vector<double> out;
    for (const c10::IValue& e : v.toListRef()) {
      if (!e.isDouble() && !e.isInt())
        throw Error(ErrorCategory::usage, "state key '" + key + "': a list must hold numbers");
      out.push_back(e.isDouble() ? e.toDouble() : static_cast<double>(e.toInt()));
    }
    return out;
  }
  throw Error(ErrorCategory::usage, "state key '" + key + "' holds a " + v.tagKind() +
                                        "; a plugin state holds bool, int, float, str or a list of floats");
}

}  // namespace

ScalerCore::ScalerCore(c10::Dict<std::string, std::string> plugins,
                       c10::Dict<std::string, std::string> options, std::string precision,
                       std::vector<std::string> plugin_dirs, bool allow_untrusted, bool cuda, int64_t rank,
                       int64_t world_size) {
  guarded([&] {
    std::map<std::string, StrategyChoice> choices;
    for (const char* kind : kStepKinds) choices[kind] = StrategyChoice{};
    for (const auto& entry : plugins) {
      check_step_kind(entry.key());
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
    }
    choices["comm"] = StrategyChoice{"local", {}};
    registry_ = std::make_unique<Registry>(registry_options(plugin_dirs, allow_untrusted));
    set_ = StrategySet::load(*registry_, choices);
    set_->create(0);
    if (set_->nan_policy().rollback_plan().enabled())
      throw Error(ErrorCategory::usage,
                  "NaN policy '" + set_->selected("nan_policy").plugin->info().name +
                      "' rolls back to a snapshot of the model, which ampkit.GradScaler does not hold; use "
                      "nan_policy 'skip', 'backoff' or 'abort'");
    step_ = std::make_unique<AmpStep>(AmpStrategies{&set_->scaler(), &set_->clipper(), &set_->nan_policy()});
  });
}

double ScalerCore::scale() const {
  return guarded([&] { return step_->scale(); });
}

std::tuple<bool, double> ScalerCore::unscale(std::vector<at::Tensor> grads,
                                             std::vector<at::Tensor> parameters,
                                             std::vector<std::string> names, bool fold,
                                             std::optional<at::Tensor> loss) {
  return guarded([&] {
    if (grads.size() != parameters.size() || names.size() != parameters.size())
      throw Error(ErrorCategory::internal, "unscale: gradients, parameters and names differ in count");
    if (!started_) {
      RunInfo info = info_;
      info.parameter_names = names;
      step_->start(info);
      started_ = true;
    }
    StepOutcome out;
    out.stats.step = step_index_;
    out.stats.scale = step_->scale();
    out.stats.consecutive_skips = consecutive_skips_;
    const bool on_device = prefers_device_stats(parameters);
    at::Tensor device_loss;
    if (loss && loss->defined()) {
      if (on_device)
        device_loss = loss->detach().to(at::kDouble).reshape({1});
      else
        out.stats.loss = read_scalar(loss->detach());
    }
    step_->measure(grads, out.stats, on_device, device_loss);
    const NanAction action = step_->decide(out);
    double factor = 1.0;
    if (action == NanAction::proceed || action == NanAction::clip) {
      factor = step_->unscale_and_clip(parameters, grads, out, fold);
      out.stepped = true;
    } else {
      // Not stepped: the gradients are unscaled all the same, as GradScaler.unscale_ does.
      scale_grads_(grads, 1.0 / out.stats.scale);
      if (action == NanAction::skip_backoff) step_->back_off();
    }
    last_ = out;
    last_names_ = std::move(names);
    iteration_.push_back(std::move(out));
    return std::make_tuple(last_.stepped, factor);
  });
}

double ScalerCore::update() {
  return guarded([&] {
    if (iteration_.empty()) throw Error(ErrorCategory::usage, "No inf checks were recorded prior to update.");
    // The iteration's statistics over all its optimizers: overflow anywhere counts; norms add.
    StepOutcome merged = iteration_.front();
    double squares = merged.stats.grad_norm_scaled * merged.stats.grad_norm_scaled;
    for (size_t i = 1; i < iteration_.size(); ++i) {
      const StepStats& s = iteration_[i].stats;
      squares += s.grad_norm_scaled * s.grad_norm_scaled;
      merged.stats.found_inf = merged.stats.found_inf || s.found_inf;
      merged.stats.grad_max_abs_scaled = std::max(merged.stats.grad_max_abs_scaled, s.grad_max_abs_scaled);
      merged.stats.grad_elements += s.grad_elements;
      merged.stats.tensor_norms.insert(merged.stats.tensor_norms.end(), s.tensor_norms.begin(),
                                       s.tensor_norms.end());
      merged.stepped = merged.stepped && iteration_[i].stepped;
      if (merged.decision.action == NanAction::proceed) merged.decision = iteration_[i].decision;
    }
    merged.stats.grad_norm_scaled = std::sqrt(squares);
    merged.stats.grad_norm = merged.stats.grad_norm_scaled / merged.stats.scale;
    merged.stats.grad_max_abs = merged.stats.grad_max_abs_scaled / merged.stats.scale;
    iteration_.clear();
    ++step_index_;
    consecutive_skips_ = merged.stepped ? 0 : consecutive_skips_ + 1;
    step_->update_scaler(merged, merged.decision.action);
    last_.scale_next = merged.scale_next;
    if (merged.decision.action == NanAction::abort) throw TrainingAborted(merged.decision.reason);
    return merged.scale_next;
  });
}

void ScalerCore::set_scale(double scale) {
  guarded([&] {
    if (!(scale > 0.0) || !std::isfinite(scale))
      throw Error(ErrorCategory::usage,
                  "new_scale must be a positive finite number, got " + format_number(scale));
    State state = strategy("scaler").save();
    if (!state.has("scale"))
      throw Error(ErrorCategory::usage,
                  "scaler '" + plugin("scaler").at(0) +
                      "' keeps no scale in its state, so update(new_scale) cannot set it");
    state.set("scale", static_cast<double>(static_cast<float>(scale)));
    strategy("scaler").load(state);
    iteration_.clear();
    ++step_index_;
  });
}

std::string ScalerCore::option(const std::string& kind, const std::string& name) const {
  return guarded([&] {
    check_step_kind(kind);
    for (const auto& s : set_->selected(kind).options.settings)
      if (s.name == name) return s.value;
    throw Error(ErrorCategory::usage, plugin(kind).at(0) + " has no option '" + name + "'");
  });
}

void ScalerCore::set_option(const std::string& kind, const std::string& name, const std::string& value) {
  guarded([&] {
    check_step_kind(kind);
    SelectedStrategy& s = set_->selected(kind);
    OptionInputs inputs;
    for (const auto& setting : s.options.settings)
      if (setting.source != "default" && setting.set && setting.source.rfind("default for", 0) != 0)
        inputs.command_line[setting.name] = setting.value;
    inputs.command_line[name] = value;
    inputs.precision = info_.precision;
    ResolvedOptions resolved = resolve_options(s.plugin->descriptor(), inputs);
    std::unique_ptr<Strategy> made;
    {
      PluginCall call(kind.c_str(), "its constructor");
      made = s.plugin->create(resolved.values);
    }
    if (started_) {
      RunInfo info = info_;
      info.parameter_names = last_names_;
      PluginCall call(kind.c_str(), "start()");
      made->start(info);
    }
    const State saved = s.strategy->save();
    {
      PluginCall call(kind.c_str(), "load()");
      made->load(saved);
    }
    s.strategy = std::move(made);
    s.options = std::move(resolved);
    step_ = std::make_unique<AmpStep>(AmpStrategies{&set_->scaler(), &set_->clipper(), &set_->nan_policy()});
  });
}

std::vector<std::vector<std::string>> ScalerCore::settings(const std::string& kind) const {
  return guarded([&] {
    check_step_kind(kind);
    std::vector<std::vector<std::string>> rows;
    for (const auto& s : set_->selected(kind).options.settings) rows.push_back({s.name, s.value, s.source});
    return rows;
  });
}

std::vector<std::string> ScalerCore::plugin(const std::string& kind) const {
  return guarded([&] {
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
  return guarded([&] {
    c10::Dict<std::string, c10::IValue> out = any_dict();
    State s;
    {
      PluginCall call(kind.c_str(), "save()");
      s = strategy(kind).save();
    }
    for (const auto& [key, value] : s.values()) out.insert(key, to_ivalue(value));
    return out;
  });
}

void ScalerCore::load_state(const std::string& kind, c10::Dict<std::string, c10::IValue> state) {
  guarded([&] {
    State s;
    for (const auto& entry : state) {
      const StateValue v = from_ivalue(entry.key(), entry.value());
      std::visit([&](const auto& x) { s.set(entry.key(), x); }, v);
    }
    try {
      PluginCall call(kind.c_str(), "load()");
      strategy(kind).load(s);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCategory::checkpoint,
                  kind + " '" + plugin(kind).at(0) + "' cannot load this state: " + e.what());
    }
  });
}

c10::Dict<std::string, c10::IValue> ScalerCore::record() const {
  return guarded([&] {
    const StepOutcome& o = last_;
    c10::Dict<std::string, c10::IValue> r = any_dict();
    r.insert("step", o.stats.step);
    r.insert("scale", o.stats.scale);
    r.insert("scale_next", o.scale_next);
    r.insert("grad_norm", o.stats.grad_norm);
    r.insert("grad_norm_clipped", o.grad_norm_clipped);
    r.insert("grad_max_abs", o.stats.grad_max_abs);
    r.insert("zero_fraction", o.stats.zero_fraction);
    r.insert("clip_coef", o.clip_coefficient);
    r.insert("clip_threshold", o.clip_threshold);
    r.insert("clipped", o.stepped && o.clip_coefficient < 1.0);
    r.insert("found_inf", o.stats.found_inf);
    r.insert("action", std::string(to_string(o.decision.action)));
    r.insert("reason", o.decision.reason);
    r.insert("stepped", o.stepped);
    c10::List<c10::IValue> top(c10::AnyType::get());
    if (last_names_.size() == o.stats.tensor_norms.size())
      for (size_t i : largest_norms(o.stats.tensor_norms, 5)) {
        c10::Dict<std::string, c10::IValue> layer = any_dict();
        layer.insert("name", last_names_[i]);
        layer.insert("grad_norm", o.stats.tensor_norms[i]);
        top.push_back(c10::IValue(layer));
      }
    r.insert("top_layers", c10::IValue(top));
    c10::Dict<std::string, c10::IValue> layers = any_dict();
    if (last_names_.size() == o.stats.tensor_norms.size())
      for (size_t i = 0; i < last_names_.size(); ++i) layers.insert(last_names_[i], o.stats.tensor_norms[i]);
    r.insert("layer_norms", c10::IValue(layers));
    return r;
  });
}

std::vector<std::vector<std::string>> list_plugins(std::vector<std::string> plugin_dirs,
                                                   bool allow_untrusted) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    std::vector<std::vector<std::string>> rows;
    for (const PluginInfo& p : registry.scan().plugins)
      rows.push_back({p.kind, p.name, p.version, p.summary, p.is_static ? std::string() : p.path.string()});
    return rows;
  });
}

std::vector<std::vector<std::string>> plugin_options(std::vector<std::string> plugin_dirs,
                                                     bool allow_untrusted, std::string kind,
                                                     std::string name) {
  return guarded([&] {
    Registry registry(registry_options(plugin_dirs, allow_untrusted));
    const LoadedPlugin& p = registry.load(registry.find(kind, name));
    const ampkit_plugin_descriptor& d = p.descriptor();
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < d.option_count; ++i) {
      const ampkit_option_spec& s = d.options[i];
      rows.push_back(
          {s.name, describe_option_type(s), s.default_value ? s.default_value : "", s.help ? s.help : ""});
    }
    return rows;
  });
}

}  // namespace ampkit::python
