// --config with a DeepSpeed config (docs/configuration.md, "DeepSpeed configs").
#include "config/deepspeed_file.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "ampkit/deepspeed_config.h"
#include "ampkit/error.h"

namespace ampkit {

bool is_deepspeed_file(const YAML::Node& root) {
  if (!root.IsMap()) return false;
  std::vector<std::string> keys;
  for (const auto& item : root)
    if (item.first.IsScalar()) keys.push_back(item.first.as<std::string>());
  return is_deepspeed_config(keys);
}

std::vector<std::string> deepspeed_file_words(const std::string& file, TrainConfig& cfg) {
  std::ifstream in(file);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw Error(ErrorCategory::usage, "config file " + file + " cannot be read");
  const DeepSpeedMapping m = map_deepspeed_config(text.str(), file);
  std::vector<std::string> words = {"--precision=" + std::string(to_string(m.precision))};
  for (const auto& [kind, name] : m.plugins) words.push_back("--" + kind + "=" + name);
  for (const auto& [kind, options] : m.options)
    for (const auto& [name, value] : options) cfg.plugin_options_file[kind][name] = value;
  if (m.micro_batch_size) words.push_back("--batch-size=" + std::to_string(*m.micro_batch_size));
  if (m.accumulation_steps) words.push_back("--accumulate=" + std::to_string(*m.accumulation_steps));
  std::vector<std::string> unmapped = m.unmapped;
  if (m.global_batch_size && !m.micro_batch_size)
    unmapped.push_back("train_batch_size (--batch-size is per rank: give train_micro_batch_size_per_gpu)");
  if (!unmapped.empty()) {
    std::string keys;
    for (const auto& k : unmapped) keys += (keys.empty() ? "" : ", ") + k;
    cfg.config_warnings.push_back("DeepSpeed config " + file +
                                  ": keys with no ampkit counterpart, ignored: " + keys);
  }
  return words;
}

}  // namespace ampkit
