// --config FILE: a YAML (or JSON) file of option: value, or a DeepSpeed config.
#pragma once

#include <string>
#include <vector>

#include "config/train_config.h"

namespace ampkit {

// The file's options as command-line words (--name=value), parsed below the command line; its
// plugin options (under opt:) go into cfg.plugin_options_file. Throws Error(usage) with one line
// for an unknown key (with "did you mean"), a command-line-only option, a bad value's shape.
std::vector<std::string> config_file_words(const std::string& file, TrainConfig& cfg);

}  // namespace ampkit
