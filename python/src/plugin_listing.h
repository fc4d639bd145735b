// What the registry finds, for ampkit.plugins() and the seeds' per-precision defaults.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "ampkit/registry.h"

namespace ampkit::python {

// The Python package's registry settings: `dirs` only (it names its own plugin folder), no crash
// probe, and its argument names in messages.
RegistryOptions registry_options(const std::vector<std::string>& dirs, bool allow_untrusted);

// What the registry finds: (kind, name, version, summary, path) rows, and one plugin's options
// as (name, type, default, help) rows.
std::vector<std::vector<std::string>> list_plugins(std::vector<std::string> plugin_dirs,
                                                   bool allow_untrusted);
std::vector<std::vector<std::string>> plugin_options(std::vector<std::string> plugin_dirs,
                                                     bool allow_untrusted, std::string kind,
                                                     std::string name);
// One option's default for each precision, (precision, value text), as the registry resolves it:
// a per-precision default's pairs in their declared order, a plain default for every precision,
// nothing for an option without a default.
std::vector<std::tuple<std::string, std::string>> option_defaults(std::vector<std::string> plugin_dirs,
                                                                  bool allow_untrusted, std::string kind,
                                                                  std::string name, std::string option);

}  // namespace ampkit::python
