// ampkit-train's options, each declared once: name, type, default, range or choices, launcher
// variables, help and the TrainConfig field it fills. --help, the range and type checks, the YAML
// keys, the launcher environment and --print-config are all generated from this table.
#pragma once

#include <ampkit/option_text.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace ampkit {

enum class OptionType {
  flag,              // present or not (--weights-only); YAML true/false
  boolean,           // true|false (also yes|no|on|off|1|0)
  integer,           // int64, within the option's range (and the field's type)
  unsigned_integer,  // uint64 (--seed)
  number,            // a finite double
  text,              // a string, one of `choices` when there are any
  list,              // repeatable string (--opt, --inject, --plugin-dir)
};

// One option's value after its text was checked against its type and range.
struct HostOptionValue {
  int64_t integer = 0;
  uint64_t unsigned_integer = 0;
  double number = 0;
  bool boolean = false;
  std::string text;
  std::vector<std::string> list;
};

struct HostOption {
  std::string name;  // --NAME on the command line, NAME in the YAML file and in --print-config
  char short_name = 0;
  OptionType type = OptionType::text;
  std::optional<std::string> default_value;  // text form; unset: not set unless given
  NumberRange bounds;                        // integer and number options
  std::vector<std::string> choices;          // text options with a fixed set of values
  std::string help;
  // Launcher variables (torchrun, then SLURM, then Open MPI) that set this option when the
  // command line does not; the first one set wins and overrides the config file.
  std::vector<std::string> environment;
  bool command_line_only = false;  // --help, --config, --print-config: not a YAML key
  bool listed = true;              // shown by --print-config when it has a value
  // Every rank of a job must be started with the same value (checked right after the
  // rendezvous): the training's own settings, not where a rank writes or which device it uses.
  bool same_on_every_rank = false;
  std::string group;  // --help's group: "" for ampkit-train's own, "workload NAME" for a workload's
  // Stores the checked value in its TrainConfig field; empty for options read elsewhere.
  std::function<void(TrainConfig&, const HostOptionValue&)> store;

  // Builders, so that a table row reads as one declaration.
  HostOption& range(std::optional<double> lo, std::optional<double> hi) {
    bounds.min = lo;
    bounds.max = hi;
    return *this;
  }
  HostOption& above(double lo) {  // > lo
    bounds.min = lo;
    bounds.min_exclusive = true;
    return *this;
  }
  HostOption& one_of(std::vector<std::string> values) {
    choices = std::move(values);
    return *this;
  }
  HostOption& shared_by_ranks() {
    same_on_every_rank = true;
    return *this;
  }
  HostOption& from_environment(std::vector<std::string> variables) {
    environment = std::move(variables);
    return *this;
  }
};

// The table, in --help and --print-config order.
const std::vector<HostOption>& host_option_table();
// Every option's name, in table order (for "did you mean").
std::vector<std::string> option_names();
// The option called `name`; throws Error(internal) when there is none (a host bug).
const HostOption& host_option(const std::string& name);

// Checks `text` against the option's type, range and choices. Throws Error(usage) with one line
// ("--batch-size must be in [1, 1048576], got 0"), naming `source` unless it is the command line.
HostOptionValue parse_option_value(const HostOption& option, const std::string& text,
                                   const std::string& source);
// The value as --print-config shows it: numbers in their shortest form (1e-3 -> 0.001).
std::string canonical_text(const HostOption& option, const HostOptionValue& value);
// "[1, 1048576]", "> 0", ">= 0", "(0, 65536]"; empty without a range.
std::string range_text(const HostOption& option);

// Reads an environment variable; nullptr when unset. Tests pass their own.
using EnvironmentLookup = std::function<const char*(const char*)>;
// What the launchers say about an option: the first of its variables that is set and not empty,
// as {value, "environment (VAR)"}. A SLURM node list gives its first host ("node[7-8]" -> node7)
// and SLURM_NTASKS_PER_NODE's "2(x3)" gives 2.
std::optional<std::pair<std::string, std::string>> launcher_value(const HostOption& option,
                                                                  const EnvironmentLookup& getenv);
// --device-ids: a comma list of CUDA device indices, each checked as an integer in [0, 2^20].
void store_device_ids(TrainConfig& cfg, const HostOptionValue& v);
// --opt KIND.OPTION=VALUE, kept per kind as text for the registry to check against the plugin.
void store_plugin_option(TrainConfig& cfg, const std::string& item);
// "node[01-04,07],gpu3" -> "node01": the first host of a SLURM node list (rank 0's host).
std::string first_slurm_host(const std::string& list);

}  // namespace ampkit
