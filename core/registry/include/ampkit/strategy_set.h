// One loaded plugin of each kind, with its resolved options and its strategy, reached by type.
#pragma once

#include <ampkit/comm_backend.h>
#include <ampkit/fp8_recipe.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"

namespace ampkit {

// What to load for one kind: a plugin name (or a path to its file) and its option inputs.
struct StrategyChoice {
  std::string name;
  OptionInputs options;
};

// A selected plugin: its file, its resolved options and, once created, its strategy.
struct SelectedStrategy {
  std::string kind;
  const LoadedPlugin* plugin = nullptr;
  ResolvedOptions options;
  // Every call into it is a plugin call (guarded_strategies.h): reported by name when it crashes,
  // exits or hangs, a plugin error naming the call when it throws.
  std::unique_ptr<Strategy> strategy;
  std::string description;  // "scaler 'dynamic' 0.1.0 (/x/libampkit-scaler-dynamic.so)"
};

// The plugin of `kind` a run uses when none is chosen: scaler none, clipper none, nan_policy skip,
// comm local (one process, as plain torch trains); "" for fp8_recipe: none (kinds.h's optional_kind).
const char* default_plugin(const std::string& kind);

// The four strategies of a run (loss scaler, gradient clipper, NaN policy, comm backend), loaded
// by name in one call:
//   auto set = StrategySet::load(registry, {{"scaler", {"dynamic", inputs}}, ...});
//   set->create();
//   Trainer trainer(..., {&set->scaler(), &set->clipper(), &set->nan_policy(), &set->comm()}, ...);
class StrategySet {
 public:
  // Finds the plugin of every kind in kKinds (a kind missing from `choices` gets its
  // default_plugin; an optional kind missing or named "" is left out), loads them together (one crash probe
  // for all) and resolves their options. Throws ampkit::Error (plugin, usage) naming what is wrong.
  static std::unique_ptr<StrategySet> load(Registry& registry,
                                           const std::map<std::string, StrategyChoice>& choices);

  // Creates the strategies from the resolved options (the plugins' factories run here), each
  // inside a PluginCall (plugin_call.h) limited to `timeout_seconds`: a constructor that crashes,
  // calls exit() or does not return is reported by name where a host installed the reporter.
  // Every later call into a scaler, clipper or NaN policy has the same limit.
  void create(unsigned timeout_seconds = 30);

  // Makes the strategy of `kind` again from `inputs` (resolved as load() resolves them), the way
  // create() made it: its constructor a plugin call, the strategy guarded; then its start(`started`)
  // when the run had started (nullptr: not yet), and load() of the state the old one saves, as a
  // resumed run would. The old strategy is dropped; pointers to it are stale.
  void reconfigure(const std::string& kind, const OptionInputs& inputs, const RunInfo* started);

  LossScaler& scaler() const;
  GradClipper& clipper() const;
  NanPolicy& nan_policy() const;
  CommBackend& comm() const;
  // The fp8 recipe, or nullptr when none was named (it is optional).
  Fp8Recipe* fp8_recipe() const;

  // Whether a plugin of `kind` is loaded: every kind but an optional one that was not named.
  bool has(const std::string& kind) const;
  // The selected plugin of a kind; every kind is present but an optional one not named.
  const SelectedStrategy& selected(const std::string& kind) const;
  SelectedStrategy& selected(const std::string& kind);
  // All of them, in kKinds order.
  const std::vector<SelectedStrategy>& all() const { return selected_; }
  std::vector<SelectedStrategy>& all() { return selected_; }

 private:
  Strategy& created(const std::string& kind) const;
  std::unique_ptr<Strategy> make(const SelectedStrategy& s, const ResolvedOptions& options) const;
  std::vector<SelectedStrategy> selected_;
  unsigned timeout_seconds_ = 30;
};

}  // namespace ampkit
