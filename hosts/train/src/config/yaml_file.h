// The YAML (or JSON) file of --config: one document of a regular file, or Error(usage).
#pragma once

#include <yaml-cpp/node/node.h>

#include <string>

namespace ampkit {

// Throws Error(usage) naming the file for a missing or non-regular file (a FIFO would block, a
// folder is no file), invalid YAML, nesting too deep, or more than one document.
YAML::Node load_config_yaml(const std::string& file);

}  // namespace ampkit
