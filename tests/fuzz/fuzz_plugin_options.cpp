// Fuzz target: option-value parsing and resolve_options. A plugin descriptor with one option of
// each type and flag (ranges, exclusive bounds, choices, per-precision defaults), and values from
// the input: each line "c|f|e NAME=VALUE" sets NAME on the command line, in the config file or in
// the environment (AMPKIT_SCALER_<NAME>); a first line "precision=P" sets the run's precision.
#include <cstdlib>

#include "ampkit/plugin_options.h"
#include "fuzz_support.h"

namespace {

const ampkit_option_spec kSpecs[] = {
    {"flag", AMPKIT_OPTION_BOOL, 0, "false", 0, 0, nullptr, "a bool"},
    {"count", AMPKIT_OPTION_INT, AMPKIT_OPTION_HAS_MIN | AMPKIT_OPTION_HAS_MAX, "10", 0, 1e6, nullptr,
     "an int"},
    {"ratio", AMPKIT_OPTION_FLOAT,
     AMPKIT_OPTION_HAS_MIN | AMPKIT_OPTION_MIN_EXCLUSIVE | AMPKIT_OPTION_HAS_MAX, "0.5", 0, 1, nullptr,
     "a float in (0, 1]"},
    {"scale", AMPKIT_OPTION_FLOAT, AMPKIT_OPTION_PER_PRECISION | AMPKIT_OPTION_HAS_MIN,
     "fp16=1;bf16=5;fp32=10", 0, 0, nullptr, "a per-precision float"},
    {"label", AMPKIT_OPTION_STRING, 0, nullptr, 0, 0, nullptr, "an unset string"},
    {"mode", AMPKIT_OPTION_CHOICE, 0, "a", 0, 0, "a|b|inf", "a choice"},
    {"steps", AMPKIT_OPTION_INT, AMPKIT_OPTION_PER_PRECISION, "fp16=3", 0, 0, nullptr, "fp16 only"},
};

const ampkit_plugin_descriptor kDescriptor = {AMPKIT_ABI_VERSION,
                                              sizeof(ampkit_plugin_descriptor),
                                              "scaler",
                                              "fuzz",
                                              "1.0",
                                              "fuzzed options",
                                              "",
                                              "",
                                              1,
                                              sizeof(kSpecs) / sizeof(kSpecs[0]),
                                              kSpecs,
                                              nullptr};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ampkit::OptionInputs in;
  in.config_file_name = "fuzz.yaml";
  std::vector<std::string> set_env;
  for (const std::string& line : ampkit::fuzz::lines(data, size)) {
    if (line.rfind("precision=", 0) == 0) {
      const std::string p = line.substr(10);
      if (p == "fp16") in.precision = ampkit::Precision::fp16;
      if (p == "bf16") in.precision = ampkit::Precision::bf16;
      if (p == "fp32") in.precision = ampkit::Precision::fp32;
      continue;
    }
    const auto eq = line.find('=');
    if (line.size() < 3 || line[1] != ' ' || eq == std::string::npos) continue;
    const std::string name = line.substr(2, eq - 2), value = line.substr(eq + 1);
    if (line[0] == 'c') in.command_line[name] = value;
    if (line[0] == 'f') in.config_file[name] = value;
    if (line[0] == 'e' && name.find('\0') == std::string::npos && value.find('\0') == std::string::npos) {
      const std::string var = ampkit::option_environment_name("scaler", name);
      ::setenv(var.c_str(), value.c_str(), 1);
      set_env.push_back(var);
    }
  }
  ampkit::fuzz::refuse_only_with_error([&] {
    const ampkit::ResolvedOptions r = ampkit::resolve_options(kDescriptor, in);
    (void)ampkit::format_option_table(r.settings, true);
  });
  for (const auto& var : set_env) ::unsetenv(var.c_str());
  return 0;
}
