// How the Python package finds and loads plugins (plugin_registry.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ampkit/registry.h"

namespace ampkit::python {

// The registry of a GradScaler or an ampkit.plugins call: `dirs` searched (the package's own
// plugin folder among them), each plugin file probed in an exec'd child (ampkit/_probe) within
// `timeout` seconds (0: no limit; ampkit.plugins' calls take ampkit-train's default).
RegistryOptions registry_options(const std::vector<std::string>& dirs, bool allow_untrusted,
                                 int64_t timeout = 30);

// What the registry finds: (kind, name, version, summary, path) rows, and one plugin's options
// as (name, type, default, help) rows.
std::vector<std::vector<std::string>> list_plugins(std::vector<std::string> plugin_dirs,
                                                   bool allow_untrusted);
std::vector<std::vector<std::string>> plugin_options(std::vector<std::string> plugin_dirs,
                                                     bool allow_untrusted, std::string kind,
                                                     std::string name);

}  // namespace ampkit::python
