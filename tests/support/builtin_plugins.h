// Test helper: the built-in plugins of the build tree, created with options resolved as the host does.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/strategy_set.h"
#include "ampkit/trainer.h"
#include "test_paths.h"

namespace ampkit::test {

struct BuiltinPlugins {
  Registry registry{[] {
    RegistryOptions o;
    o.plugin_dirs = {ampkit::test::plugin_dir()};
    o.use_environment = false;
    o.use_default_dirs = false;
    o.probe = false;
    return o;
  }()};
  const LoadedPlugin& plugin(const std::string& kind, const std::string& name) {
    return registry.load(registry.find(kind, name));
  }
  // Defaults and ranges applied exactly as ampkit-train applies them, then the factory.
  std::unique_ptr<Strategy> make(const std::string& kind, const std::string& name,
                                 std::map<std::string, std::string> options = {}) {
    const LoadedPlugin& p = plugin(kind, name);
    OptionInputs in;
    in.command_line = std::move(options);
    in.read_environment = false;
    return p.create(resolve_options(p.descriptor(), in).values);
  }
  // A choice for StrategySet::load: a plugin name and its command-line options, no environment.
  static StrategyChoice choice(std::string name, std::map<std::string, std::string> options = {}) {
    StrategyChoice c;
    c.name = std::move(name);
    c.options.command_line = std::move(options);
    c.options.read_environment = false;
    return c;
  }
  // The four strategies as ampkit-train loads and creates them (StrategySet); kinds left out get
  // their defaults (scaler none, clipper none, nan_policy skip, comm local).
  std::unique_ptr<StrategySet> strategies(const std::map<std::string, StrategyChoice>& choices = {}) {
    auto set = StrategySet::load(registry, choices);
    set->create();
    return set;
  }
  // The Trainer's view of a set.
  static TrainerStrategies of(const StrategySet& s) {
    return {&s.scaler(), &s.clipper(), &s.nan_policy(), &s.comm()};
  }
};

}  // namespace ampkit::test
