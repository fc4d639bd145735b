// ampkit-train: the reference host; trains a workload with plugins chosen by name at run time.
#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <numeric>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "ampkit/metrics.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/trainer.h"
#include "ampkit/train_config.h"
#include "workload.h"

namespace ampkit::train {

namespace {

struct SelectedPlugin {
  std::string kind;
  const LoadedPlugin* plugin = nullptr;
  ResolvedOptions options;
  std::unique_ptr<Strategy> strategy;
};

const char* selector_flag(const std::string& kind) {
  if (kind == "scaler") return "--scaler";
  if (kind == "clipper") return "--clipper";
  if (kind == "nan_policy") return "--nan-policy";
  return "--comm";
}

bool given_on_command_line(const TrainConfig& cfg, const std::string& option) {
  for (const auto& s : cfg.settings)
    if (s.name == option) return s.source != "default";
  return false;
}

void print_config(const TrainConfig& cfg, const std::vector<SelectedPlugin>& plugins) {
  std::printf("ampkit-train effective configuration\n");
  size_t w = 0;
  for (const auto& s : cfg.settings) w = std::max(w, s.name.size());
  for (const auto& s : cfg.settings)
    std::printf("  %-*s  %-28s  (%s)\n", static_cast<int>(w), s.name.c_str(), s.value.c_str(), s.source.c_str());
  for (const auto& p : plugins) {
    const PluginInfo& info = p.plugin->info();
    std::printf("\n%s '%s' %s  [%s]\n", p.kind.c_str(), info.name.c_str(), info.version.c_str(),
                info.is_static ? "static" : info.path.c_str());
    std::printf("%s", format_option_table(p.options.settings, /*with_source=*/true).c_str());
  }
}

// Mismatches between precision and strategies that silently waste work or lose gradients
// (the class of mistake behind misaligned amp/fp16/mixed_precision settings): one line each.
std::vector<std::string> precision_warnings(const TrainConfig& cfg, const std::vector<SelectedPlugin>& plugins,
                                            const LossScaler& scaler) {
  std::vector<std::string> out;
  const std::string precision = to_string(cfg.precision);
  const std::string scaler_name = plugins[0].plugin->info().name;
  if (cfg.precision != Precision::fp16 && scaler.is_dynamic())
    out.push_back("--precision " + precision + " with the dynamic loss scaler '" + scaler_name + "': " + precision +
                  " has fp32's exponent range, so scaling only costs work; use --scaler none");
  if (cfg.precision == Precision::fp16 && !scaler.is_dynamic() && scaler.scale() == 1.0)
    out.push_back("--precision fp16 with scaler '" + scaler_name +
                  "' (scale 1): gradients below 6e-8 underflow to zero in fp16; use a dynamic scaler or --scaler static");
  if (cfg.precision == Precision::fp16) {
    for (const auto& setting : plugins[1].options.settings) {
      if (setting.name != "max_norm" || !setting.set || setting.source == "default") continue;
      const double v = std::strtod(setting.value.c_str(), nullptr);
      if (v == 5.0 || v == 10.0)
        out.push_back("note: clipper.max_norm=" + setting.value + " is the usual " + (v == 5.0 ? "bf16" : "fp32") +
                      " starting point; fp16 runs usually start at 1.0 (docs/gradient-clipping.md)");
    }
  }
  return out;
}

int run(int argc, const char* const argv[]) {
  const auto wall_start = std::chrono::steady_clock::now();
  TrainConfig cfg = parse_train_config(argc, argv);

  RegistryOptions registry_options;
  for (const auto& d : cfg.plugin_dirs) registry_options.plugin_dirs.emplace_back(d);
  registry_options.allow_untrusted = cfg.allow_untrusted_plugins;
  Registry registry(registry_options);

  if (cfg.help) {
    std::printf("%s", train_options_help().c_str());
    for (const auto& kind : kPluginKinds) {
      const std::string option = std::string(selector_flag(kind)).substr(2);
      if (!given_on_command_line(cfg, option)) continue;
      const LoadedPlugin& p = registry.load(registry.find(kind, cfg.plugins[kind]));
      std::vector<OptionSetting> specs;
      OptionInputs none;
      none.read_environment = false;
      specs = resolve_options(p.descriptor(), none).settings;
      std::printf("\n%s '%s' options (--opt %s.NAME=VALUE, env %s):\n%s", kind.c_str(), p.info().name.c_str(),
                  kind.c_str(), option_environment_name(kind, "NAME").c_str(),
                  format_option_table(specs, /*with_source=*/false).c_str());
    }
    return 0;
  }

  std::vector<SelectedPlugin> plugins;
  for (const auto& kind : kPluginKinds) {
    SelectedPlugin s;
    s.kind = kind;
    s.plugin = &registry.load(registry.find(kind, cfg.plugins[kind]));
    OptionInputs inputs;
    inputs.command_line = cfg.plugin_options_cli[kind];
    inputs.config_file = cfg.plugin_options_file[kind];
    inputs.config_file_name = cfg.config_file;
    s.options = resolve_options(s.plugin->descriptor(), inputs);
    plugins.push_back(std::move(s));
  }
  if (cfg.print_config) {
    print_config(cfg, plugins);
    return 0;
  }
  for (auto& p : plugins) p.strategy = p.plugin->create(p.options.values);
  auto* scaler = static_cast<LossScaler*>(plugins[0].strategy.get());
  auto* clipper = static_cast<GradClipper*>(plugins[1].strategy.get());
  auto* nan_policy = static_cast<NanPolicy*>(plugins[2].strategy.get());
  auto* comm = static_cast<CommBackend*>(plugins[3].strategy.get());
  comm->init(DistributedConfig{});
  std::vector<std::string> warnings = precision_warnings(cfg, plugins, *scaler);
  for (const auto& w : warnings)
    std::fprintf(stderr, "ampkit-train: %s%s\n", w.rfind("note: ", 0) == 0 ? "" : "warning: ", w.c_str());
  const bool report_underflow = cfg.precision == Precision::fp16 && !scaler->is_dynamic() && scaler->scale() == 1.0;

  if (cfg.threads > 0) at::set_num_threads(cfg.threads);
  if (cfg.device == "cuda" && !torch::cuda::is_available())
    throw Error(ExitCode::usage, "--device cuda, but no CUDA device is visible to LibTorch");
  const at::Device device(cfg.device == "cuda" ? at::kCUDA : at::kCPU);
  torch::manual_seed(cfg.seed);
  std::unique_ptr<Workload> workload = cfg.workload == "fashion-mnist" ? make_fashion_mnist(cfg, device)
                                       : cfg.workload == "char-gpt"    ? make_char_gpt(cfg, device)
                                                                       : make_synthetic(cfg, device);

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : workload->module().named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (cfg.optimizer == "adamw")
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  else
    optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(cfg.weight_decay));

  const int64_t steps_per_epoch = workload->batches_per_epoch() / cfg.accumulate;
  if (steps_per_epoch < 1)
    throw Error(ExitCode::usage, "--batch-size x --accumulate exceeds one epoch of " + cfg.workload);
  const int64_t total_steps = cfg.steps > 0 ? cfg.steps : cfg.epochs * steps_per_epoch;
  LrSchedule schedule;
  schedule.kind = cfg.lr_schedule == "cosine" ? LrSchedule::Kind::cosine : LrSchedule::Kind::constant;
  schedule.base_lr = cfg.lr;
  schedule.warmup_steps = cfg.warmup_steps;
  schedule.total_steps = total_steps;
  Trainer trainer(cfg.precision, cfg.accumulate, params, names, *optimizer, {scaler, clipper, nan_policy, comm}, schedule);
  RunInfo info;
  info.rank = comm->rank();
  info.world_size = comm->world_size();
  trainer.start(info);

  MetricsWriter metrics(cfg.metrics_file);
  ProgressLine progress(total_steps, cfg.log_every, cfg.progress != "never");
  const double samples_per_step = static_cast<double>(cfg.batch_size * cfg.accumulate * comm->world_size());
  std::deque<double> recent_losses;
  int64_t nan_events = 0, clipped_steps = 0;
  std::string abort_reason;
  const auto train_start = std::chrono::steady_clock::now();
  double last_time = 0;
  int64_t epoch = -1;
  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t e = step / steps_per_epoch;
    if (e != epoch) {
      epoch = e;
      workload->start_epoch(epoch);
    }
    const int64_t first_batch = (step % steps_per_epoch) * cfg.accumulate;
    const StepOutcome out = trainer.step([&](int micro) { return workload->loss(first_batch + micro); });
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
    const double sps = samples_per_step / std::max(now - last_time, 1e-9);
    last_time = now;
    if (out.stats.found_inf) ++nan_events;
    if (report_underflow && step == 0 && !out.stats.found_inf) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "measured at step 0: %.2f%% of gradient elements are exactly zero (fp16 underflow without scaling)",
                    100.0 * out.stats.zero_fraction);
      warnings.emplace_back(line);
      std::fprintf(stderr, "ampkit-train: warning: %s\n", line);
    }
    if (out.stepped && out.clip_coefficient < 1.0) ++clipped_steps;
    if (std::isfinite(out.stats.loss)) {
      recent_losses.push_back(out.stats.loss);
      if (recent_losses.size() > 20) recent_losses.pop_front();
    }
    metrics.write(step_record(out, epoch, trainer.steps_skipped(), sps, now));
    progress.update(step + 1, out, sps);
    if (out.decision.action == NanAction::abort) {
      abort_reason = out.decision.reason;
      break;
    }
  }
  progress.finish();
  const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();

  nlohmann::json summary;
  summary["status"] = abort_reason.empty() ? "completed" : "aborted";
  if (!abort_reason.empty()) summary["abort_reason"] = abort_reason;
  summary["workload"] = cfg.workload;
  summary["precision"] = to_string(cfg.precision);
  for (const auto& p : plugins)
    summary["plugins"][p.kind] = {{"name", p.plugin->info().name}, {"version", p.plugin->info().version}};
  summary["steps"] = trainer.steps_attempted();
  summary["steps_taken"] = trainer.steps_taken();
  summary["skipped_steps"] = trainer.steps_skipped();
  summary["nan_events"] = nan_events;
  summary["clip_rate"] = trainer.steps_taken() ? static_cast<double>(clipped_steps) / trainer.steps_taken() : 0.0;
  summary["final_loss"] = recent_losses.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                : std::accumulate(recent_losses.begin(), recent_losses.end(), 0.0) / recent_losses.size();
  if (abort_reason.empty()) {
    if (auto eval = workload->evaluate(cfg.eval_batches)) {
      summary["test_loss"] = eval->loss;
      summary["test_accuracy"] = eval->accuracy;
      if (eval->perplexity) summary["test_perplexity"] = *eval->perplexity;
    }
  }
  summary["samples_per_second"] = train_seconds > 0 ? samples_per_step * trainer.steps_attempted() / train_seconds : 0.0;
  summary["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  summary["param_sha256"] = parameter_sha256(params);
  summary["warnings"] = warnings;
  if (summary["final_loss"].is_number_float() && !std::isfinite(summary["final_loss"].get<double>())) summary["final_loss"] = "nan";
  if (!cfg.summary_file.empty()) write_json_file(cfg.summary_file, summary);
  print_summary_table(stdout, summary);
  if (!abort_reason.empty()) {
    std::fprintf(stderr, "ampkit-train: training aborted by nan_policy '%s' at step %lld: %s\n",
                 plugins[2].plugin->info().name.c_str(), static_cast<long long>(trainer.steps_attempted() - 1),
                 abort_reason.c_str());
    return static_cast<int>(ExitCode::nan_abort);
  }
  return 0;
}

}  // namespace
}  // namespace ampkit::train

int main(int argc, char** argv) {
  try {
    return ampkit::train::run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-train: error: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ampkit-train: LibTorch error: %s\n", e.what_without_backtrace());
    return static_cast<int>(ampkit::ExitCode::internal);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampkit-train: internal error: %s\n", e.what());
    return static_cast<int>(ampkit::ExitCode::internal);
  }
}
