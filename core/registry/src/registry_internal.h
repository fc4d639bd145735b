// What registry.cpp shares with plugin_probe.cpp; not installed.
#pragma once

#include "ampkit/registry.h"

namespace ampkit::detail {

// dlopen()s the plugin file (RTLD_NOW | RTLD_LOCAL, never unloaded), calls its entry and checks
// the descriptor against the file's metadata. Throws Error(plugin) naming the file.
// `report_faults`: inside a PluginCall naming the plugin (the host's own load); the probe's child
// passes false, its parent judges a crash there.
const ampkit_plugin_descriptor* load_descriptor(const PluginInfo& info, bool report_faults = true);

// After the host has loaded a plugin (`handle` from dlopen): the plugin's own calls of exit,
// quick_exit, _exit and _Exit reach the fault reporter (plugin_call.cpp), which names the plugin
// whatever the host, and a crash in its code outside any plugin call is known as the plugin's.
// Its static initializers ran before this: an exit() there is caught by the reporter's atexit
// hook, an _exit() there by the probe that loaded it first.
void guard_loaded_plugin(void* handle);

}  // namespace ampkit::detail
