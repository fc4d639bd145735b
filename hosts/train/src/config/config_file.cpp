// --config's file: its keys as command-line words for the one parser, its plugin options kept per
// kind; a DeepSpeed config is mapped (config/deepspeed_file.h).
#include "config/config_file.h"

#include <ampkit/kinds.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>
#include <string>

#include "ampkit/error.h"
#include "config/deepspeed_file.h"
#include "config/option_table.h"
#include "config/yaml_file.h"

namespace ampkit {

namespace {

// The kinds this program selects plugins of: all of them (the optional one by --fp8).
std::vector<std::string> kind_name_list() {
  std::vector<std::string> names;
  for (const KindInfo& k : kKinds) names.push_back(k.name);
  return names;
}

std::string scalar_text(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar()) throw Error(ErrorCategory::usage, where + " must be a single value");
  return n.as<std::string>();
}

// opt: {KIND: {OPTION: VALUE}} in the config file, kept per kind for the registry.
// YAML forbids a key twice in one mapping, but yaml-cpp keeps both and the later would win in
// silence: refused, naming the key with its path.
void refuse_repeated_key(std::set<std::string>& seen, const std::string& key, const std::string& file) {
  if (!seen.insert(key).second)
    throw Error(ErrorCategory::usage,
                "config file " + file + " gives key '" + key + "' twice: give each key once");
}

void read_yaml_plugin_options(const YAML::Node& node, const std::string& file, TrainConfig& cfg) {
  if (!node.IsMap())
    throw Error(ErrorCategory::usage,
                "key 'opt' in config file " + file +
                    " must map plugin kinds to options, e.g. opt: {scaler: {scale: 512}}");
  std::set<std::string> kinds;
  for (const auto& kind_item : node) {
    const std::string kind = scalar_text(kind_item.first, "a key under opt: in config file " + file);
    refuse_repeated_key(kinds, "opt." + kind, file);
    if (find_kind(kind) == nullptr) {
      const std::vector<std::string> names = kind_name_list();
      std::string listed;
      for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
      const std::string hint = did_you_mean(kind, names);
      throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind + "' under opt: in config file " +
                                            file + (hint.empty() ? "" : "; " + hint) + " (kinds: " + listed +
                                            ")");
    }
    if (!kind_item.second.IsMap())
      throw Error(ErrorCategory::usage,
                  "opt." + kind + " in config file " + file + " must map option names to values");
    std::set<std::string> names;
    for (const auto& o : kind_item.second) {
      const std::string name = scalar_text(o.first, "a key under opt." + kind + " in config file " + file);
      refuse_repeated_key(names, "opt." + kind + "." + name, file);
      cfg.plugin_options_file[kind][name] =
          scalar_text(o.second, "opt." + kind + "." + name + " in config file " + file);
    }
  }
}

// Turns one YAML key into command-line words, so one parser reads both sources.
void yaml_words(const HostOption& option, const YAML::Node& value, const std::string& where,
                std::vector<std::string>& words) {
  if (value.IsSequence() && option.type == OptionType::list) {
    for (const auto& v : value) words.push_back("--" + option.name + "=" + scalar_text(v, where));
  } else if (option.type == OptionType::flag) {
    const std::string v = scalar_text(value, where);
    if (v != "true" && v != "false")
      throw Error(ErrorCategory::usage, where + " must be true or false, got '" + v + "'");
    if (v == "true") words.push_back("--" + option.name);
  } else {
    words.push_back("--" + option.name + "=" + scalar_text(value, where));
  }
}

}  // namespace

std::vector<std::string> config_file_words(const std::string& file, TrainConfig& cfg) {
  const YAML::Node root = load_config_yaml(file);
  if (root.IsNull()) return {};
  if (!root.IsMap())
    throw Error(ErrorCategory::usage, "config file " + file + " must be a mapping of option: value");
  if (is_deepspeed_file(root)) return deepspeed_file_words(file, cfg);
  std::vector<std::string> words;
  std::set<std::string> keys;
  for (const auto& item : root) {
    if (!item.first.IsScalar())
      throw Error(ErrorCategory::usage, "config file " + file + " has a key that is not a plain name");
    const std::string key = item.first.as<std::string>();
    refuse_repeated_key(keys, key, file);
    const std::string where = "key '" + key + "' in config file " + file;
    if (key == "opt") {
      read_yaml_plugin_options(item.second, file, cfg);
      continue;
    }
    const auto& table = host_option_table();
    const auto it =
        std::find_if(table.begin(), table.end(), [&](const HostOption& o) { return o.name == key; });
    if (it == table.end()) {
      const std::string hint = did_you_mean(key, option_names());
      throw Error(ErrorCategory::usage, "unknown " + where + (hint.empty() ? "" : "; " + hint));
    }
    if (it->command_line_only)
      throw Error(ErrorCategory::usage, where + " is only accepted on the command line");
    yaml_words(*it, item.second, where, words);
  }
  return words;
}

}  // namespace ampkit
