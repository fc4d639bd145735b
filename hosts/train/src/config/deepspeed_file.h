// --config with a DeepSpeed config: its fp16/bf16/gradient_clipping/batch keys as ampkit-train's.
#pragma once

#include <yaml-cpp/node/node.h>

#include <string>
#include <vector>

#include "config/train_config.h"

namespace ampkit {

// True when the config file's top-level keys are DeepSpeed's (fp16, bf16, gradient_clipping, ...).
bool is_deepspeed_file(const YAML::Node& root);

// The command-line words of a DeepSpeed config (--precision, --scaler, --clipper, --batch-size,
// --accumulate; lower in priority than the command line, as any --config), its plugin options
// into cfg.plugin_options_file and one warning naming the keys without a counterpart into
// cfg.config_warnings (map_deepspeed_config in ampkit/deepspeed_config.h, shared with
// ampkit.GradScaler.from_deepspeed_config).
std::vector<std::string> deepspeed_file_words(const std::string& file, TrainConfig& cfg);

}  // namespace ampkit
