// Naming the plugin behind a strategy where only its interface is at hand: a strategy that a
// StrategySet guards (core/registry/src/guarded_strategies.h) answers find_function with this name
// by its plugin's description ("scaler 'dynamic' 0.1.0 (/x/libampkit-scaler-dynamic.so)"), a C
// string that lives as long as the strategy; the plugin itself is never asked.
#pragma once

#include <cstring>

namespace ampkit {

inline constexpr const char* kPluginDescriptionQuery = "ampkit_host_plugin_description";

inline bool is_plugin_description_query(const char* name) {
  return name != nullptr && std::strcmp(name, kPluginDescriptionQuery) == 0;
}

}  // namespace ampkit
