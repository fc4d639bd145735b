// Every call into a strategy is a plugin call: a crash, an exit() or a hang inside it is reported
// naming the plugin and the call (plugin_call.h), and an exception from it becomes a plugin error
// naming them, whoever made the call (the engine, the host, a checkpoint, Python).
#pragma once

#include <ampkit/strategy.h>

#include <memory>
#include <string>

namespace ampkit {

// Wraps the strategy `inner` of `kind` (one of kinds.h). `description` names the plugin in
// errors ("scaler 'dynamic' 0.1.0 (/x/libampkit-scaler-dynamic.so)"). Calls of the scaler, the
// clipper and the NaN policy are limited to `timeout_seconds` (0: none); comm calls are not
// (a collective waits for the other ranks, which --dist-timeout bounds), and their exceptions
// pass unchanged (the host names a lost rank from them). Exceptions that pass unchanged anywhere:
// ampkit::Error (already categorized) and TrainingAborted (a deliberate stop).
std::unique_ptr<Strategy> guard_strategy(const std::string& kind, std::unique_ptr<Strategy> inner,
                                         const std::string& description, unsigned timeout_seconds);

}  // namespace ampkit
