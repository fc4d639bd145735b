// Merges a plugin's option values from command line, environment, config file and defaults.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/options.h>
#include <ampkit/step.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ampkit {

// Where an option's value came from, highest precedence first; `source` says it in words.
enum class OptionOrigin { command_line, environment, config_file, default_value, unset };

struct OptionSetting {
  std::string name;
  std::string type;    // "float > 1", "int >= 0", "choice 2|inf", ...
  std::string value;   // effective text value, "" when unset
  std::string source;  // "default", "default for fp16", "command line", "environment AMPKIT_X_Y",
                       // "config file F", "unset"
  OptionOrigin origin = OptionOrigin::unset;
  std::string default_value;  // per-precision defaults in canonical form: "fp16=1;bf16=5;fp32=10"
  // A per-precision default (AMPKIT_OPTION_PER_PRECISION): precision -> canonical value, in the
  // spec's order; empty otherwise.
  std::vector<std::pair<std::string, std::string>> precision_defaults;
  std::string help;
  bool set = false;
};

struct OptionInputs {
  std::map<std::string, std::string> command_line;  // option -> value (from --opt kind.option=v)
  // How the host names where `command_line` came from, in sources and messages: ampkit-train's
  // "command line", the Python package's "ampkit.GradScaler" (its opt= and setters).
  std::string command_line_name = "command line";
  std::map<std::string, std::string> config_file;  // from the YAML file
  std::string config_file_name;
  bool read_environment = true;
  // The run's precision, which picks per-precision defaults; without it such options stay unset
  // unless a value is given.
  std::optional<Precision> precision;
};

struct ResolvedOptions {
  OptionValues values;
  std::vector<OptionSetting> settings;  // in declaration order
};

// Highest first: command line, environment AMPKIT_<KIND>_<OPTION>, config file, default (for a
// per-precision default: the one for inputs.precision, source "default for fp16").
// Throws Error(usage) for an unknown option (with "did you mean") or a bad value (naming the
// option, the value, where it came from and what is accepted).
ResolvedOptions resolve_options(const ampkit_plugin_descriptor& d, const OptionInputs& inputs);

// "float > 1", "int in [0, 100]", "choice 2|inf", "bool" — the accepted values of a spec.
std::string describe_option_type(const ampkit_option_spec& spec);
// Name of the environment variable for an option: AMPKIT_NAN_POLICY_MAX_CONSECUTIVE.
std::string option_environment_name(const std::string& kind, const std::string& option);

}  // namespace ampkit

namespace ampkit {
// An aligned table of options: name, type, value (or default), [source,] help.
std::string format_option_table(const std::vector<OptionSetting>& settings, bool with_source);
}  // namespace ampkit
