// Loading the strategies of a run by name, and reaching each by its type.
#include "ampkit/strategy_set.h"

#include "ampkit/error.h"
#include "ampkit/plugin_call.h"
#include "guarded_strategies.h"

namespace ampkit {

const char* default_plugin(const std::string& kind) {
  if (kind == "nan_policy") return "skip";
  if (kind == "comm") return "local";
  if (kind == "fp8_recipe") return "";  // optional: none unless one is named
  return "none";                        // scaler, clipper: train as plain torch would
}

std::unique_ptr<StrategySet> StrategySet::load(Registry& registry,
                                               const std::map<std::string, StrategyChoice>& choices) {
  for (const auto& [kind, choice] : choices)
    if (find_kind(kind) == nullptr)
      throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind + "' (kinds: " + kind_names() + ")");
  std::vector<PluginInfo> found;
  std::vector<StrategyChoice> chosen;
  std::vector<const char*> kinds;
  for (const KindInfo& kind : kKinds) {
    const auto it = choices.find(kind.name);
    // An optional kind (an fp8 recipe) is loaded only when a plugin of it is named.
    if (optional_kind(kind) && (it == choices.end() || it->second.name.empty())) continue;
    chosen.push_back(it != choices.end() ? it->second : StrategyChoice{default_plugin(kind.name), {}});
    found.push_back(registry.find(kind.name, chosen.back().name));
    kinds.push_back(kind.name);
  }
  // All found first, then loaded together: their crash probe is one child, not four.
  const std::vector<const LoadedPlugin*> loaded = registry.load_all(found);
  auto set = std::make_unique<StrategySet>();
  for (size_t i = 0; i < kinds.size(); ++i) {
    SelectedStrategy s;
    s.kind = kinds[i];
    s.plugin = loaded[i];
    s.options = resolve_options(s.plugin->descriptor(), chosen[i].options);
    const PluginInfo& info = s.plugin->info();
    s.description = s.kind + " '" + info.name + "' " + info.version + " (" +
                    (info.is_static ? std::string("linked into this program") : info.path.string()) + ")";
    plugin_id(s.description);  // among the "plugins loaded" a fault outside any call names
    set->selected_.push_back(std::move(s));
  }
  return set;
}

std::unique_ptr<Strategy> StrategySet::make(const SelectedStrategy& s, const ResolvedOptions& options) const {
  std::unique_ptr<Strategy> created;
  {
    PluginCall call(plugin_id(s.description), "its constructor", timeout_seconds_);
    created = s.plugin->create(options.values);
  }
  return guard_strategy(s.kind, std::move(created), s.description, timeout_seconds_);
}

void StrategySet::create(unsigned timeout_seconds) {
  timeout_seconds_ = timeout_seconds;
  for (auto& s : selected_) s.strategy = make(s, s.options);
}

void StrategySet::reconfigure(const std::string& kind, const OptionInputs& inputs, const RunInfo* started) {
  SelectedStrategy& s = selected(kind);
  const Strategy& old = created(kind);
  ResolvedOptions resolved = resolve_options(s.plugin->descriptor(), inputs);
  std::unique_ptr<Strategy> made = make(s, resolved);  // guarded: each call below is a plugin call
  if (started != nullptr) made->start(*started);
  made->load(old.save());
  s.strategy = std::move(made);
  s.options = std::move(resolved);
}

bool StrategySet::has(const std::string& kind) const {
  for (const auto& s : selected_)
    if (s.kind == kind) return true;
  return false;
}

const SelectedStrategy& StrategySet::selected(const std::string& kind) const {
  for (const auto& s : selected_)
    if (s.kind == kind) return s;
  throw Error(ErrorCategory::internal, "no " + kind + " plugin in the strategy set");
}

SelectedStrategy& StrategySet::selected(const std::string& kind) {
  return const_cast<SelectedStrategy&>(static_cast<const StrategySet&>(*this).selected(kind));
}

Strategy& StrategySet::created(const std::string& kind) const {
  const SelectedStrategy& s = selected(kind);
  if (!s.strategy) throw Error(ErrorCategory::internal, kind + " strategy used before StrategySet::create()");
  return *s.strategy;
}

// The registry checked each plugin's kind against its interface before loading it, so these
// casts cannot pick the wrong type; they are the only ones (the host and the tests use these).
LossScaler& StrategySet::scaler() const {
  return static_cast<LossScaler&>(created("scaler"));
}
GradClipper& StrategySet::clipper() const {
  return static_cast<GradClipper&>(created("clipper"));
}
NanPolicy& StrategySet::nan_policy() const {
  return static_cast<NanPolicy&>(created("nan_policy"));
}
CommBackend& StrategySet::comm() const {
  return static_cast<CommBackend&>(created("comm"));
}
Fp8Recipe* StrategySet::fp8_recipe() const {
  return has("fp8_recipe") ? &static_cast<Fp8Recipe&>(created("fp8_recipe")) : nullptr;
}

}  // namespace ampkit
