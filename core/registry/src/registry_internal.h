// What registry.cpp shares with plugin_probe.cpp; not installed.
#pragma once

#include "ampkit/registry.h"

namespace ampkit::detail {

// dlopen()s the plugin file (RTLD_NOW | RTLD_LOCAL, never unloaded), calls its entry and checks
// the descriptor against the file's metadata. Throws Error(plugin) naming the file.
// `report_faults`: inside a PluginCall naming the plugin (the host's own load); the probe's child
// passes false, its parent judges a crash there.
const ampkit_plugin_descriptor* load_descriptor(const PluginInfo& info, bool report_faults = true);

}  // namespace ampkit::detail
