// What the registry finds, for ampkit.plugins() and the seeds' per-precision defaults and thresholds.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ampkit/registry.h"

namespace ampkit::python {

// The registry of a GradScaler or an ampkit.plugins call: `dirs` searched (the package's own
// plugin folder among them), each plugin file probed in an exec'd child (ampkit/_probe) within
// `timeout` seconds (0: no limit; ampkit.plugins' calls take ampkit-train's default), and its
// argument names in messages.
RegistryOptions registry_options(const std::vector<std::string>& dirs, bool allow_untrusted,
                                 int64_t timeout = 30);

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
// The option a clipper's one threshold sets (the seeds' GradientClipper(threshold=) and
// AMPConfig.max_grad_norm): the one option whose default the plugin declares per precision, as a
// threshold is what fp16, bf16 and fp32 need apart; Error(usage) for a clipper with none or several.
std::string threshold_option(std::vector<std::string> plugin_dirs, bool allow_untrusted, std::string name);

}  // namespace ampkit::python
