// What registry.cpp shares with plugin_probe.cpp; not installed.
#pragma once

#include "ampkit/registry.h"

namespace ampkit::detail {

// dlopen()s the plugin file (RTLD_NOW | RTLD_LOCAL, never unloaded), calls its entry and checks
// the descriptor against the file's metadata. Throws Error(plugin) naming the file.
const ampkit_plugin_descriptor* load_descriptor(const PluginInfo& info);

}  // namespace ampkit::detail
