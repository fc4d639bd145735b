// The plugin kinds, declared once: every message, --help, ampkit-plugins, the registry and
// the CMake helper's KIND check (which reads this table, see sdk/cmake/ampkitPlugin.cmake) use it.
#pragma once

#include <cstddef>
#include <string>

namespace ampkit {

// What a kind is. A program's words for it are not here: ampkit's programs spell the selector
// with kind_flag() (hosts/common), and StrategySet's default_plugin() names the default plugin.
struct KindInfo {
  const char* name;   // the one spelling: symbols, folders, options KIND.X, AMPKIT_<KIND>_X
  const char* title;  // what the interface is, for humans
  bool tensors;       // the interface passes at::Tensor: plugins link LibTorch
};

// The order is the order of --help, ampkit-plugins list and the strategy set. One line per kind,
// in this exact shape: CMake extracts the names with a regular expression.
inline constexpr KindInfo kKinds[] = {
    {"scaler", "loss scaler", false},
    {"clipper", "gradient clipper", true},
    {"nan_policy", "NaN policy", false},
    {"comm", "communication backend", true},
    {"fp8_recipe", "fp8 scaling recipe", false},
};
inline constexpr std::size_t kKindCount = sizeof(kKinds) / sizeof(kKinds[0]);

// The kind called `name`, or nullptr.
inline const KindInfo* find_kind(const std::string& name) {
  for (const KindInfo& k : kKinds)
    if (name == k.name) return &k;
  return nullptr;
}

// Whether a run has a plugin of `kind` only when one is asked for: an fp8 recipe serves a model's
// fp8 layers, and a model without them has none. A run always has one plugin of every other kind
// (StrategySet's default_plugin()).
inline bool optional_kind(const KindInfo& kind) {
  return std::string(kind.name) == "fp8_recipe";
}

// "scaler, clipper, nan_policy, comm, fp8_recipe", for messages that list the kinds.
inline std::string kind_names(const char* separator = ", ") {
  std::string out;
  for (const KindInfo& k : kKinds) out += (out.empty() ? "" : separator) + std::string(k.name);
  return out;
}

}  // namespace ampkit
