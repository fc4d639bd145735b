// Fuzz target: the launchers' environment (torchrun, SLURM, Open MPI, MPICH) as ampkit-train
// reads it for each host option (launcher_value), and SLURM node lists (first_slurm_host). Each
// input line is VAR=VALUE.
#include <map>

#include "config/option_table.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  for (const std::string& line : ampkit::fuzz::lines(data, size)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  const ampkit::EnvironmentLookup lookup = [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  for (const ampkit::HostOption& option : ampkit::host_option_table())
    ampkit::fuzz::refuse_only_with_error([&] {
      if (const auto v = ampkit::launcher_value(option, lookup))
        (void)ampkit::parse_option_value(option, v->first, v->second);
    });
  for (const auto& entry : env)
    ampkit::fuzz::refuse_only_with_error([&] { (void)ampkit::first_slurm_host(entry.second); });
  return 0;
}
