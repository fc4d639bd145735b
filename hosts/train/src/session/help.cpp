// --help and --print-config: what ampkit-train would do, without doing it.
#include <cstdio>

#include "ampkit/exit_codes.h"
#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/kind_flags.h"
#include "session/session.h"

namespace ampkit::train {

namespace {

bool given_on_command_line(const TrainConfig& cfg, const std::string& option) {
  for (const auto& s : cfg.settings)
    if (s.name == option) return s.source != "default";
  return false;
}

// The statistics recipe and the host sync as far as the configuration decides them
// alone: the strategies' device forms are known once they are made, so the summary's "step" says
// what ran.
void print_step_config(const TrainConfig& cfg) {
  const bool cuda = cfg.device == "cuda";
  StatsRecipeFacts facts;  // ampkit-train's master weights are fp32, on one device
  facts.all_cpu_float = !cuda;
  facts.cuda_devices = cuda ? 1 : 0;
  facts.kernel_dtypes = true;
  facts.kernel_built = chunk_kernel_built();
  const ResolvedStatsRecipe recipe = choose_stats_recipe(DeviceStatsRecipe::automatic, facts);
  const std::string recipe_why = !recipe.fallback.empty() ? recipe.fallback
                                 : cuda                   ? "the statistics kernel, on one CUDA device"
                                                          : "fp32 parameters on the CPU";
  std::string sync = "deferred", sync_why;
  if (cfg.host_sync == "step")
    sync = "step", sync_why = "--host-sync step";
  else if (cfg.host_sync == "auto" && !cuda)
    sync = "step", sync_why = "auto on the CPU";
  else if (cfg.optimizer != "adamw")
    sync = "step",
    sync_why = "--optimizer " + cfg.optimizer + " takes no grad_scale and found_inf on the device";
  else
    sync_why = std::string("where every strategy has a device form") +
               (cfg.dist.world_size > 1 ? " and the comm backend a c10d process group" : "") +
               " (checked when they are made; the summary's step.host_sync says what ran)";
  std::printf("\nstep\n  statistics recipe  %-10s  (%s)\n  host sync          %-10s  (%s)\n",
              to_string(recipe.recipe), recipe_why.c_str(), sync.c_str(), sync_why.c_str());
}

}  // namespace

RegistryOptions registry_options(const TrainConfig& cfg) {
  RegistryOptions options;
  for (const auto& d : cfg.plugin_dirs) options.plugin_dirs.emplace_back(d);
  options.allow_untrusted = cfg.allow_untrusted_plugins;
  options.plugin_dirs_name = "--plugin-dir";
  options.allow_untrusted_name = "--allow-untrusted-plugins";
  options.probe_timeout_seconds = static_cast<double>(cfg.plugin_timeout);
  return options;
}

int print_help(const TrainConfig& cfg) {
  Registry registry(registry_options(cfg));
  std::printf("%s%s\n", train_options_help().c_str(),
              exit_codes_help({ExitCode::ok, ExitCode::internal, ExitCode::usage, ExitCode::plugin,
                               ExitCode::data, ExitCode::aborted, ExitCode::checkpoint, ExitCode::distributed,
                               ExitCode::output, ExitCode::interrupted})
                  .c_str());
  for (const KindInfo& k : kKinds) {
    const std::string kind = k.name;
    if (!given_on_command_line(cfg, kind_flag(k))) continue;
    const LoadedPlugin& p = registry.load(registry.find(kind, cfg.plugins.at(kind)));
    OptionInputs none;
    none.read_environment = false;
    none.precision = cfg.precision;  // the table lists every per-precision default anyway
    const std::vector<OptionSetting> specs = resolve_options(p.descriptor(), none).settings;
    std::printf("\n%s '%s' options (--opt %s.NAME=VALUE, env %s):\n%s", kind.c_str(), p.info().name.c_str(),
                kind.c_str(), option_environment_name(kind, "NAME").c_str(),
                format_option_table(specs, /*with_source=*/false).c_str());
  }
  return 0;
}

void print_config(const TrainConfig& cfg, const StrategySet& strategies) {
  std::printf("ampkit-train effective configuration\n");
  size_t w = 0;
  for (const auto& s : cfg.settings) w = std::max(w, s.name.size());
  for (const auto& s : cfg.settings)
    std::printf("  %-*s  %-28s  (%s)\n", static_cast<int>(w), s.name.c_str(), s.value.c_str(),
                s.source.c_str());
  print_step_config(cfg);
  for (const auto& p : strategies.all()) {
    const PluginInfo& info = p.plugin->info();
    std::printf("\n%s '%s' %s  [%s]\n", p.kind.c_str(), info.name.c_str(), info.version.c_str(),
                info.is_static ? "static" : info.path.c_str());
    std::printf("%s", format_option_table(p.options.settings, /*with_source=*/true).c_str());
  }
}

}  // namespace ampkit::train
