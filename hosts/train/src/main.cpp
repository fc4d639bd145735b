// ampkit-train: the reference host; trains a workload with plugins chosen by name at run time.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <malloc.h>
#include <signal.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "ampkit/checkpoint.h"
#include "ampkit/device_support.h"
#include "ampkit/exit_codes.h"
#include "ampkit/fault_injection.h"
#include "ampkit/fused_adamw.h"
#include "ampkit/metrics.h"
#include "ampkit/nan_locator.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "config/train_config.h"
#include "ampkit/trainer.h"
#include "workloads/workload.h"

namespace ampkit::train {

namespace {

struct SelectedPlugin {
  std::string kind;
  const LoadedPlugin* plugin = nullptr;
  ResolvedOptions options;
  std::unique_ptr<Strategy> strategy;
};

// SIGTERM/SIGINT/SIGUSR1: the first one asks the loop to stop after the current step (then a
// checkpoint and the summary are written, exit 130); a second one exits at once, and so does the
// first one while the rank waits in the rendezvous (nothing is trained yet, nothing to save).
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_in_rendezvous = 0;

// The comm backend of a multi-process run, for explaining a failed collective in main().
CommBackend* g_comm = nullptr;

// Each rank's `local` values, in rank order, on every rank (an all-gather on all_reduce_mean:
// every rank fills its own slot of a zero tensor).
std::vector<double> gather(CommBackend& comm, const std::vector<double>& local, const at::Device& device) {
  const int64_t n = static_cast<int64_t>(local.size()), world = comm.world_size();
  if (world == 1) return local;
  at::Tensor all = at::zeros({world * n}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t i = 0; i < n; ++i) all[comm.rank() * n + i] = local[static_cast<size_t>(i)];
  std::vector<at::Tensor> tensors = {all.to(device)};
  comm.all_reduce_mean(tensors);
  const at::Tensor sum = tensors[0].cpu() * static_cast<double>(world);
  std::vector<double> out(static_cast<size_t>(world * n));
  for (int64_t i = 0; i < world * n; ++i) out[static_cast<size_t>(i)] = sum[i].item<double>();
  return out;
}

void on_stop_signal(int signal_number) {
  if (g_stop_signal != 0 || g_in_rendezvous != 0) ::_exit(exit_status(ExitCode::interrupted));
  g_stop_signal = signal_number;
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(s, &action, nullptr);
}

const char* signal_name(int s) {
  return s == SIGTERM ? "SIGTERM" : s == SIGINT ? "SIGINT" : s == SIGUSR1 ? "SIGUSR1" : "a signal";
}

// Parameters and buffers by name: what a checkpoint's model.pt holds.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

// Loads a verified checkpoint into the run: model always; with `full`, also optimizer, plugin
// states, counters and RNG after checking that the same plugins and optimizer are selected.
void check_resumable(const LoadedCheckpoint& ckpt, const TrainConfig& cfg,
                     const std::vector<SelectedPlugin>& plugins) {
  const std::string where = "checkpoint " + ckpt.folder.string();
  for (const auto& p : plugins) {
    const PluginInfo& info = p.plugin->info();
    const PluginStateRecord* saved = nullptr;
    for (const auto& r : ckpt.manifest.plugins)
      if (r.kind == p.kind) saved = &r;
    if (saved == nullptr)
      throw Error(ErrorCategory::checkpoint, where + " has no state for a " + p.kind + " plugin");
    if (saved->name != info.name || saved->version != info.version)
      throw Error(ErrorCategory::checkpoint,
                  where + " was written with " + p.kind + " '" + saved->name + "' " + saved->version +
                      ", this run selects " + p.kind + " '" + info.name + "' " + info.version +
                      "; select the same plugin, or pass --weights-only to load only the parameters");
  }
  for (const auto& s : ckpt.manifest.config) {
    if (s.value("name", "") != "optimizer") continue;
    if (s.value("value", "") != cfg.optimizer)
      throw Error(ErrorCategory::checkpoint, where + " was written with --optimizer " + s.value("value", "") +
                                                 ", this run uses --optimizer " + cfg.optimizer +
                                                 "; pass --weights-only to load only the parameters");
  }
}

// The model's leaf modules: the hook points the workloads tap, in registration order.
std::vector<std::string> hook_points(torch::nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    if (item.value()->children().empty()) out.push_back(item.key());
  return out;
}

// "torch::nn::LinearImpl" -> "Linear".
std::string module_type(torch::nn::Module& root, const std::string& path) {
  for (const auto& item : root.named_modules("", false)) {
    if (item.key() != path) continue;
    std::string name = item.value()->name();
    if (name.rfind("torch::nn::", 0) == 0) name = name.substr(11);
    if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
    return name;
  }
  return "";
}

nlohmann::json summary_json(const TensorSummary& t) {
  return {{"dtype", t.dtype}, {"shape", t.shape},   {"min", t.min},
          {"max", t.max},     {"absmax", t.absmax}, {"nonfinite", t.nonfinite}};
}

nlohmann::json observation_json(const ModuleObservation& o) {
  nlohmann::json j = {{"module", o.module}, {"phase", o.phase}};
  j[o.phase == "backward" ? "gradient" : "output"] = summary_json(o.value);
  if (!o.input.dtype.empty()) j["input"] = summary_json(o.input);
  return j;
}

std::filesystem::path nan_report_dir(const TrainConfig& cfg) {
  if (!cfg.nan_report_dir.empty()) return cfg.nan_report_dir;
  for (const std::string& f : {cfg.summary_file, cfg.metrics_file})
    if (!f.empty())
      return std::filesystem::path(f).parent_path().empty() ? "." : std::filesystem::path(f).parent_path();
  return ".";
}

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
    std::printf("  %-*s  %-28s  (%s)\n", static_cast<int>(w), s.name.c_str(), s.value.c_str(),
                s.source.c_str());
  for (const auto& p : plugins) {
    const PluginInfo& info = p.plugin->info();
    std::printf("\n%s '%s' %s  [%s]\n", p.kind.c_str(), info.name.c_str(), info.version.c_str(),
                info.is_static ? "static" : info.path.c_str());
    std::printf("%s", format_option_table(p.options.settings, /*with_source=*/true).c_str());
  }
}

// Mismatches between precision and strategies that silently waste work or lose gradients
// (the class of mistake behind misaligned amp/fp16/mixed_precision settings): one line each.
std::vector<std::string> precision_warnings(const TrainConfig& cfg,
                                            const std::vector<SelectedPlugin>& plugins,
                                            const LossScaler& scaler) {
  std::vector<std::string> out;
  const std::string precision = to_string(cfg.precision);
  const std::string scaler_name = plugins[0].plugin->info().name;
  if (cfg.precision != Precision::fp16 && scaler.is_dynamic())
    out.push_back("--precision " + precision + " with the dynamic loss scaler '" + scaler_name + "': " +
                  precision + " has fp32's exponent range, so scaling only costs work; use --scaler none");
  if (cfg.precision == Precision::fp16 && !scaler.is_dynamic() && scaler.scale() == 1.0)
    out.push_back("--precision fp16 with scaler '" + scaler_name +
                  "' (scale 1): gradients below 6e-8 underflow to zero in fp16; use a dynamic scaler or "
                  "--scaler static");
  if (cfg.precision == Precision::fp16) {
    for (const auto& setting : plugins[1].options.settings) {
      if (setting.name != "max_norm" || !setting.set || setting.source.rfind("default", 0) == 0) continue;
      const double v = std::strtod(setting.value.c_str(), nullptr);
      if (v == 5.0 || v == 10.0)
        out.push_back("note: clipper.max_norm=" + setting.value + " is the usual " +
                      (v == 5.0 ? "bf16" : "fp32") +
                      " starting point; fp16 runs usually start at 1.0 (docs/gradient-clipping.md)");
    }
  }
  return out;
}

// Owns the selected plugins. When a multi-process run fails, main() still has to ask the comm
// backend which rank was lost (and then exits with _Exit), so an exception leaving run() leaks
// them instead of destroying the process group under the failure.
struct PluginSet {
  std::vector<SelectedPlugin>* plugins = new std::vector<SelectedPlugin>;
  PluginSet() = default;
  PluginSet(const PluginSet&) = delete;
  PluginSet& operator=(const PluginSet&) = delete;
  ~PluginSet() {
    if (std::uncaught_exceptions() > 0 && g_comm != nullptr) return;
    delete plugins;
  }
};

// LibTorch's CPU allocator hands large blocks to glibc, which maps blocks above its mmap threshold
// fresh from the kernel and unmaps them on free: every step's gradients and activations then
// fault in newly zeroed pages (10-13% of a step of a 10M-parameter MLP in the kernel's
// clear_page). Raising the mmap threshold to glibc's maximum and the trim threshold keeps freed
// blocks for reuse: 20% shorter steps there (docs/benchmarks.md); RSS stays at the run's peak
// instead of breathing with each step. A user's own GLIBC_TUNABLES malloc settings win.
void keep_freed_memory_for_reuse() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int run(int argc, const char* const argv[]) {
  const auto wall_start = std::chrono::steady_clock::now();
  keep_freed_memory_for_reuse();
  TrainConfig cfg = parse_train_config(argc, argv);
  install_stop_handlers();

  RegistryOptions registry_options;
  for (const auto& d : cfg.plugin_dirs) registry_options.plugin_dirs.emplace_back(d);
  registry_options.allow_untrusted = cfg.allow_untrusted_plugins;
  Registry registry(registry_options);

  if (cfg.help) {
    std::printf("%s%s\n", train_options_help().c_str(),
                exit_codes_help({ExitCode::ok, ExitCode::internal, ExitCode::usage, ExitCode::plugin,
                                 ExitCode::data, ExitCode::aborted, ExitCode::checkpoint,
                                 ExitCode::distributed, ExitCode::output, ExitCode::interrupted})
                    .c_str());
    for (const auto& kind : kPluginKinds) {
      const std::string option = std::string(selector_flag(kind)).substr(2);
      if (!given_on_command_line(cfg, option)) continue;
      const LoadedPlugin& p = registry.load(registry.find(kind, cfg.plugins[kind]));
      std::vector<OptionSetting> specs;
      OptionInputs none;
      none.read_environment = false;
      none.precision = cfg.precision;  // the table lists every per-precision default anyway
      specs = resolve_options(p.descriptor(), none).settings;
      std::printf("\n%s '%s' options (--opt %s.NAME=VALUE, env %s):\n%s", kind.c_str(), p.info().name.c_str(),
                  kind.c_str(), option_environment_name(kind, "NAME").c_str(),
                  format_option_table(specs, /*with_source=*/false).c_str());
    }
    return 0;
  }

  // All four found first, then loaded together: their crash probe is one child, not four.
  std::vector<PluginInfo> selected;
  for (const auto& kind : kPluginKinds) selected.push_back(registry.find(kind, cfg.plugins[kind]));
  const std::vector<const LoadedPlugin*> loaded = registry.load_all(selected);
  PluginSet owned_plugins;
  std::vector<SelectedPlugin>& plugins = *owned_plugins.plugins;
  for (size_t i = 0; i < kPluginKinds.size(); ++i) {
    const std::string& kind = kPluginKinds[i];
    SelectedPlugin s;
    s.kind = kind;
    s.plugin = loaded[i];
    OptionInputs inputs;
    inputs.command_line = cfg.plugin_options_cli[kind];
    inputs.config_file = cfg.plugin_options_file[kind];
    inputs.config_file_name = cfg.config_file;
    inputs.precision = cfg.precision;  // picks per-precision defaults ("default for fp16")
    s.options = resolve_options(s.plugin->descriptor(), inputs);
    plugins.push_back(std::move(s));
  }
  if (cfg.print_config) {
    print_config(cfg, plugins);
    return 0;
  }
  validate(cfg.dist, torch::cuda::is_available());
  for (auto& p : plugins) p.strategy = p.plugin->create(p.options.values);
  auto* scaler = static_cast<LossScaler*>(plugins[0].strategy.get());
  auto* clipper = static_cast<GradClipper*>(plugins[1].strategy.get());
  auto* nan_policy = static_cast<NanPolicy*>(plugins[2].strategy.get());
  if (cfg.threads > 0) {
    at::set_num_threads(cfg.threads);
  } else if (cfg.dist.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    // Ranks of one node share its cores; oversubscribed OpenMP threads spin against each other
    // and a step can take 30x longer. torchrun sets OMP_NUM_THREADS=1 for the same reason.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    at::set_num_threads(
        static_cast<int>(std::max(1u, cores / static_cast<unsigned>(cfg.dist.nproc_per_node))));
  }
  if (cfg.device == "cuda" && !torch::cuda::is_available())
    throw Error(ErrorCategory::usage, "--device cuda, but no CUDA device is visible to LibTorch");
  if (cfg.device == "cuda")
    if (const auto capability = cuda_compute_capability(0))
      if (const std::string problem = cuda_precision_problem(cfg.precision, *capability); !problem.empty())
        throw Error(ErrorCategory::usage, problem);
  const at::Device device(cfg.device == "cuda" ? at::kCUDA : at::kCPU);
  torch::manual_seed(cfg.seed);
  std::unique_ptr<Workload> workload = cfg.workload == "fashion-mnist" ? make_fashion_mnist(cfg, device)
                                       : cfg.workload == "char-gpt"    ? make_char_gpt(cfg, device)
                                                                       : make_synthetic(cfg, device);

  std::vector<Fault> faults;
  for (const auto& spec : cfg.inject) faults.push_back(parse_fault(spec));
  validate_faults(faults, hook_points(workload->module()), cfg.dist.world_size);
  FaultInjector injector(faults);
  const RollbackPlan rollback_plan = nan_policy->rollback_plan();
  if (rollback_plan.from_checkpoint && cfg.checkpoint_dir.empty())
    throw Error(ErrorCategory::usage,
                "nan_policy '" + plugins[2].plugin->info().name +
                    "' rolls back to the newest checkpoint (snapshot=checkpoint): give --checkpoint-dir");

  // Every input is checked before the rendezvous, so a bad option fails each rank on its own
  // instead of one rank leaving the others waiting in the rendezvous.
  auto* comm = static_cast<CommBackend*>(plugins[3].strategy.get());
  try {
    if (g_stop_signal != 0) ::_exit(exit_status(ExitCode::interrupted));
    g_in_rendezvous = 1;
    comm->init(cfg.dist);
    g_in_rendezvous = 0;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::distributed, "comm '" + plugins[3].plugin->info().name + "': " + e.what());
  }
  if (comm->world_size() != cfg.dist.world_size || comm->rank() != cfg.dist.rank)
    throw Error(ErrorCategory::distributed,
                "comm '" + plugins[3].plugin->info().name + "' reports rank " + std::to_string(comm->rank()) +
                    " of " + std::to_string(comm->world_size()) + ", the job says rank " +
                    std::to_string(cfg.dist.rank) + " of " + std::to_string(cfg.dist.world_size));
  if (comm->world_size() > 1) g_comm = comm;
  // Rank 0 writes metrics, summary, checkpoints and the progress line; every rank trains.
  const bool is_root = comm->rank() == 0;
  std::vector<std::string> warnings = precision_warnings(cfg, plugins, *scaler);
  if (is_root)
    for (const auto& w : warnings)
      std::fprintf(stderr, "ampkit-train: %s%s\n", w.rfind("note: ", 0) == 0 ? "" : "warning: ", w.c_str());
  // About speed, not about the run's numbers: printed, not counted among the summary's warnings.
  if (is_root && device.is_cpu())
    if (const std::string note = cpu_precision_note(cfg.precision, cpu_capabilities()); !note.empty())
      std::fprintf(stderr, "ampkit-train: %s\n", note.c_str());
  const bool report_underflow =
      cfg.precision == Precision::fp16 && !scaler->is_dynamic() && scaler->scale() == 1.0;

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : workload->module().named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (cfg.optimizer == "adamw")
    optimizer = std::make_unique<FusedAdamW>(
        params, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  else
    optimizer = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(cfg.weight_decay));

  const int64_t steps_per_epoch = workload->batches_per_epoch() / cfg.accumulate;
  if (steps_per_epoch < 1)
    throw Error(ErrorCategory::usage, "--batch-size x --accumulate exceeds one epoch of " + cfg.workload);
  const int64_t total_steps = cfg.steps > 0 ? cfg.steps : cfg.epochs * steps_per_epoch;
  LrSchedule schedule;
  schedule.kind = cfg.lr_schedule == "cosine" ? LrSchedule::Kind::cosine : LrSchedule::Kind::constant;
  schedule.base_lr = cfg.lr;
  schedule.warmup_steps = cfg.warmup_steps;
  schedule.total_steps = total_steps;
  Trainer trainer(cfg.precision, cfg.accumulate, params, names, *optimizer,
                  {scaler, clipper, nan_policy, comm}, schedule);
  RunInfo info;
  info.rank = comm->rank();
  info.world_size = comm->world_size();
  trainer.start(info);

  ProgressLine progress(total_steps, cfg.log_every, cfg.progress != "never" && is_root);
  const double samples_per_step = static_cast<double>(cfg.batch_size * cfg.accumulate * comm->world_size());
  std::deque<double> recent_losses;
  int64_t nan_events = 0, clipped_steps = 0;
  int64_t data_skip = 0;  // batches skipped by rollbacks: step s trains on data position s + data_skip
  int64_t locator_runs = 0;
  nlohmann::json nan_reports = nlohmann::json::array();
  std::string abort_reason;

  // Checkpoints (docs/configuration.md, "Checkpoints"): rank 0 writes, every rank loads.
  const bool writes_checkpoints = !cfg.checkpoint_dir.empty() && comm->rank() == 0;
  std::string resumed_from, last_checkpoint;
  if (!cfg.resume.empty()) {
    std::optional<LoadedCheckpoint> ckpt;
    if (cfg.resume == "auto") {
      std::vector<std::string> skipped;
      const auto folder = find_resume_checkpoint(cfg.checkpoint_dir, &skipped);
      for (const auto& w : skipped) std::fprintf(stderr, "ampkit-train: warning: %s\n", w.c_str());
      if (folder)
        ckpt = read_checkpoint(*folder);
      else
        std::fprintf(stderr, "ampkit-train: note: --resume auto: no valid checkpoint in %s; starting fresh\n",
                     cfg.checkpoint_dir.c_str());
    } else {
      const std::filesystem::path given(cfg.resume);
      if (std::filesystem::exists(given / "latest") && !std::filesystem::exists(given / "manifest.json"))
        throw Error(ErrorCategory::usage,
                    "--resume " + cfg.resume +
                        " holds checkpoints; name one of its step-N folders, or use --checkpoint-dir " +
                        cfg.resume + " --resume auto");
      ckpt = read_checkpoint(given);
    }
    if (ckpt) {
      if (!cfg.weights_only) check_resumable(*ckpt, cfg, plugins);
      restore_tensors(*ckpt, model_tensors(workload->module()));
      if (parameter_sha256(params) != ckpt->manifest.param_sha256)
        throw Error(ErrorCategory::checkpoint,
                    "checkpoint " + ckpt->folder.string() +
                        ": the restored parameters do not hash to the manifest's param_sha256");
      if (!cfg.weights_only) {
        restore_optimizer(*ckpt, *optimizer);
        for (auto& p : plugins) {
          for (const auto& r : ckpt->manifest.plugins) {
            if (r.kind != p.kind) continue;
            try {
              p.strategy->load(r.state);
            } catch (const std::exception& e) {
              throw Error(ErrorCategory::checkpoint, "checkpoint " + ckpt->folder.string() + ": " + p.kind +
                                                         " '" + r.name +
                                                         "' cannot load its saved state: " + e.what());
            }
          }
        }
        const CheckpointManifest& m = ckpt->manifest;
        trainer.restore_counters(m.steps_attempted, m.steps_taken, m.consecutive_skips,
                                 m.host.value("steps_discarded", int64_t{0}),
                                 m.host.value("rollbacks", int64_t{0}));
        data_skip = m.host.value("data_skip", int64_t{0});
        locator_runs = m.host.value("locator_runs", int64_t{0});
        set_cpu_rng_state(m.cpu_rng_state);
        nan_events = m.host.value("nan_events", int64_t{0});
        clipped_steps = m.host.value("clipped_steps", int64_t{0});
        for (double l : m.host.value("recent_losses", std::vector<double>{})) recent_losses.push_back(l);
      }
      resumed_from = ckpt->folder.string();
      std::fprintf(stderr, "ampkit-train: resumed from %s at step %lld%s\n", resumed_from.c_str(),
                   static_cast<long long>(trainer.steps_attempted()),
                   cfg.weights_only ? " (weights only)" : "");
    }
  }
  // Every rank holds the checkpoint's (or its own seed's) parameters; from here rank 0's are
  // everyone's, and gradients are averaged by torch's DDP Reducer during backward.
  {
    DataParallelOptions dp;
    dp.bucket_cap_mb = cfg.dist.bucket_cap_mb;
    dp.find_unused_parameters = cfg.dist.find_unused_parameters;
    dp.gradient_as_bucket_view = cfg.dist.gradient_as_bucket_view;
    dp.broadcast_buffers = cfg.dist.broadcast_buffers;
    for (const auto& item : workload->module().named_buffers()) dp.buffers.push_back(item.value());
    trainer.enable_data_parallel(dp);
  }
  const int64_t first_step = trainer.steps_attempted();
  MetricsWriter metrics(is_root ? cfg.metrics_file : "", first_step);
  LayerNormWriter layer_norms(is_root ? cfg.layer_norms_file : "", first_step);
  int64_t last_saved = first_step;
  auto save_checkpoint = [&]() {
    CheckpointManifest m;
    m.steps_attempted = trainer.steps_attempted();
    m.steps_taken = trainer.steps_taken();
    m.consecutive_skips = trainer.consecutive_skips();
    m.epoch = (trainer.steps_attempted() + data_skip) / steps_per_epoch;
    for (const auto& s : cfg.settings)
      m.config.push_back({{"name", s.name}, {"value", s.value}, {"source", s.source}});
    for (const auto& p : plugins)
      m.plugins.push_back({p.kind, p.plugin->info().name, p.plugin->info().version, p.strategy->save()});
    m.cpu_rng_state = cpu_rng_state();
    m.param_sha256 = parameter_sha256(params);
    m.host = {{"nan_events", nan_events},
              {"clipped_steps", clipped_steps},
              {"data_skip", data_skip},
              {"steps_discarded", trainer.steps_discarded()},
              {"rollbacks", trainer.rollbacks()},
              {"locator_runs", locator_runs},
              {"recent_losses", std::vector<double>(recent_losses.begin(), recent_losses.end())}};
    last_checkpoint = write_checkpoint(cfg.checkpoint_dir, std::move(m), model_tensors(workload->module()),
                                       *optimizer, cfg.keep_checkpoints)
                          .string();
    last_saved = trainer.steps_attempted();
  };

  // Rollback (docs/troubleshooting-nan.md): the policy decides, the host keeps the snapshot.
  MemorySnapshot snapshot;
  std::string rollback_source;
  if (rollback_plan.enabled()) {
    if (rollback_plan.snapshot_every > 0)
      snapshot.capture(model_tensors(workload->module()), *optimizer, trainer.steps_attempted(),
                       trainer.steps_taken());
    if (rollback_plan.from_checkpoint && writes_checkpoints && !find_resume_checkpoint(cfg.checkpoint_dir))
      save_checkpoint();  // a rollback before the first periodic checkpoint needs one to go to
    trainer.set_rollback_handler([&]() -> int64_t {
      if (!rollback_plan.from_checkpoint) {
        rollback_source = "in-memory snapshot before step " + std::to_string(snapshot.steps_attempted());
        return snapshot.restore(model_tensors(workload->module()), *optimizer);
      }
      const auto folder = find_resume_checkpoint(cfg.checkpoint_dir);
      if (!folder)
        throw Error(ErrorCategory::checkpoint,
                    "rollback: no valid checkpoint in " + cfg.checkpoint_dir + " to roll back to");
      const LoadedCheckpoint ckpt = read_checkpoint(*folder);
      restore_tensors(ckpt, model_tensors(workload->module()));
      restore_optimizer(ckpt, *optimizer);
      rollback_source = ckpt.folder.string();
      return ckpt.manifest.steps_taken;
    });
  }

  // The locator re-runs a bad step with every module observed (docs/troubleshooting-nan.md).
  std::string pre_step_rng;
  int64_t reference_batch = 0;
  nlohmann::json located;
  trainer.set_bad_step_observer([&](const StepOutcome& o, const std::function<at::Tensor(int)>& forward) {
    if (locator_runs >= cfg.nan_locate) return;
    ++locator_runs;
    LocatorInputs in;
    in.forward = forward;
    in.micro_batches = cfg.accumulate;
    in.reference = [&] { return workload->loss(reference_batch); };
    in.precision = cfg.precision;
    in.scale = o.stats.scale;
    in.accumulation_steps = cfg.accumulate;
    const std::string rng_after = cpu_rng_state();
    set_cpu_rng_state(pre_step_rng);  // the same RNG state as the step itself
    const NanLocation loc = locate_fault(in, params);
    set_cpu_rng_state(rng_after);
    nlohmann::json report = {
        {"step", o.stats.step},
        {"rank", comm->rank()},
        {"detection", o.decision.reason},
        {"action", to_string(o.decision.action)},
        {"loss_scale", o.stats.scale},
        {"precision", to_string(cfg.precision)},
        {"located", loc.found},
        {"module", loc.module},
        {"module_type", loc.module.empty() ? "" : module_type(workload->module(), loc.module)},
        {"phase", loc.phase},
        {"finding", loc.finding},
        {"micro_batch", loc.micro_batch},
        {"micro_batch_loss", std::isfinite(loc.loss) ? nlohmann::json(loc.loss) : nlohmann::json("nan")}};
    if (!loc.module.empty()) report["observation"] = observation_json(loc.observation);
    if (loc.reference_absmax > 0) report["reference_absmax"] = loc.reference_absmax;
    for (const auto& x : loc.forward) report["forward"].push_back(observation_json(x));
    for (const auto& x : loc.backward) report["backward"].push_back(observation_json(x));
    const std::filesystem::path dir = nan_report_dir(cfg);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::filesystem::path file = dir / ("nan-report-step-" + std::to_string(o.stats.step) + "-rank-" +
                                              std::to_string(comm->rank()) + ".json");
    write_json_file(file, report);
    located = {
        {"step", o.stats.step}, {"module", loc.module}, {"phase", loc.phase}, {"report", file.string()}};
    nan_reports.push_back(located);
    std::string where = loc.found
                            ? (loc.module.empty() ? "in the loss"
                                                  : "at module '" + loc.module + "' (" +
                                                        report["module_type"].get<std::string>() + ", " +
                                                        loc.observation.value.dtype + ", " + loc.phase + ")")
                            : "not located";
    std::fprintf(stderr, "ampkit-train: step %lld: %s; locator: %s: %s; report %s\n",
                 static_cast<long long>(o.stats.step), o.decision.reason.c_str(), where.c_str(),
                 loc.finding.c_str(), file.string().c_str());
  });

  const auto train_start = std::chrono::steady_clock::now();
  double last_time = 0;
  int64_t epoch = -1;
  const int world = comm->world_size();
  int agreed_stop =
      0;  // with several ranks, all stop after the same step (a signal reaches them at different times)
  for (int64_t step = trainer.steps_attempted(); step < total_steps; ++step) {
    if ((world > 1 ? agreed_stop : g_stop_signal) != 0) break;
    const int64_t data_step = step + data_skip;
    const int64_t e = data_step / steps_per_epoch;
    if (e != epoch) {
      epoch = e;
      workload->start_epoch(epoch);
    }
    const int64_t first_batch = (data_step % steps_per_epoch) * cfg.accumulate;
    reference_batch = (first_batch + cfg.accumulate) % workload->batches_per_epoch();
    if (cfg.nan_locate > locator_runs) pre_step_rng = cpu_rng_state();
    const bool faulty = injector.arm(step, comm->rank());
    located = nullptr;
    const StepOutcome out = trainer.step([&](int micro) {
      ProbeScope scope(faulty ? &injector : nullptr);
      const at::Tensor loss = workload->loss(first_batch + micro);
      return faulty ? injector.apply_to_loss(loss) : loss;
    });
    if (faulty)
      for (const Fault& f : injector.unreached())
        throw Error(ErrorCategory::usage, "--inject '" + f.spec + "': layer '" + f.layer +
                                              "' never produced an output in " + cfg.workload + "'s forward");
    if (out.decision.action == NanAction::rollback) {
      data_skip += out.decision.skip_batches;
      std::fprintf(stderr, "ampkit-train: step %lld: rolled back to the %s; skipping %lld batches\n",
                   static_cast<long long>(step), rollback_source.c_str(),
                   static_cast<long long>(out.decision.skip_batches));
    }
    if (rollback_plan.snapshot_every > 0 && out.stepped &&
        trainer.steps_taken() % rollback_plan.snapshot_every == 0)
      snapshot.capture(model_tensors(workload->module()), *optimizer, trainer.steps_attempted(),
                       trainer.steps_taken());
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
    const double sps = samples_per_step / std::max(now - last_time, 1e-9);
    last_time = now;
    if (out.stats.found_inf) ++nan_events;
    if (report_underflow && step == 0 && !out.stats.found_inf) {
      char line[200];
      std::snprintf(
          line, sizeof line,
          "measured at step 0: %.2f%% of gradient elements are exactly zero (fp16 underflow without scaling)",
          100.0 * out.stats.zero_fraction);
      warnings.emplace_back(line);
      std::fprintf(stderr, "ampkit-train: warning: %s\n", line);
    }
    if (out.stepped && out.clip_coefficient < 1.0) ++clipped_steps;
    // Only applied steps: a skipped spike's loss says nothing about the model being trained.
    if (out.stepped && std::isfinite(out.stats.loss)) {
      recent_losses.push_back(out.stats.loss);
      if (recent_losses.size() > 20) recent_losses.pop_front();
    }
    nlohmann::json record = step_record(out, epoch, trainer.steps_skipped(), sps, now);
    if (world > 1) {
      // One small all-gather per step: each rank's throughput, a stop signal any rank received,
      // and a cross-check that every rank took the same decision with the same scale (they
      // must: they saw the same averaged statistics).
      constexpr size_t kFields = 4;
      const std::vector<double> all = gather(*comm,
                                             {sps / world, static_cast<double>(g_stop_signal),
                                              static_cast<double>(out.decision.action), out.scale_next},
                                             device);
      std::vector<double> per_rank;
      for (int r = 0; r < world; ++r) {
        const double* f = &all[static_cast<size_t>(r) * kFields];
        per_rank.push_back(f[0]);
        if (f[1] != 0) agreed_stop = static_cast<int>(f[1]);
        if (f[2] != all[2] || f[3] != all[3])
          throw Error(ErrorCategory::distributed,
                      "ranks disagree at step " + std::to_string(step) + ": rank 0 decided " +
                          to_string(static_cast<NanAction>(static_cast<int>(all[2]))) + " with scale " +
                          std::to_string(all[3]) + ", rank " + std::to_string(r) + " decided " +
                          to_string(static_cast<NanAction>(static_cast<int>(f[2]))) + " with scale " +
                          std::to_string(f[3]) + " (a plugin that is not deterministic in its inputs?)");
      }
      record["rank_samples_per_second"] = per_rank;
    }
    record["data_step"] = data_step;
    record["steps_discarded"] = trainer.steps_discarded();
    record["rollbacks"] = trainer.rollbacks();
    if (!located.is_null()) record["located"] = located;
    if (cfg.layer_norms_top_k > 0)
      record["top_layers"] = top_layers(names, out.stats.tensor_norms, cfg.layer_norms_top_k);
    metrics.write(record);
    layer_norms.write(out.stats.step, names, out.stats.tensor_norms);
    progress.update(step + 1, out, sps);
    if (out.decision.action == NanAction::abort) {
      abort_reason = out.decision.reason;
      break;
    }
    if (writes_checkpoints && cfg.checkpoint_every > 0 &&
        trainer.steps_attempted() % cfg.checkpoint_every == 0)
      save_checkpoint();
  }
  progress.finish();
  if (g_stop_signal == 0 && agreed_stop != 0) g_stop_signal = agreed_stop;  // another rank was signalled
  const int stop_signal = g_stop_signal;
  // An aborted run saves too: the bad step was not applied, so the parameters are the last good ones.
  if (writes_checkpoints && last_saved != trainer.steps_attempted()) save_checkpoint();
  if (!last_checkpoint.empty() && (stop_signal != 0 || cfg.checkpoint_every == 0))
    std::fprintf(stderr, "ampkit-train: checkpoint written: %s\n", last_checkpoint.c_str());
  const double train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();

  nlohmann::json summary;
  summary["status"] = !abort_reason.empty() ? "aborted" : stop_signal != 0 ? "interrupted" : "completed";
  if (!abort_reason.empty()) summary["abort_reason"] = abort_reason;
  if (stop_signal != 0 && abort_reason.empty()) summary["interrupted_by"] = signal_name(stop_signal);
  if (!resumed_from.empty()) summary["resumed_from"] = resumed_from;
  if (!last_checkpoint.empty()) summary["checkpoint"] = last_checkpoint;
  summary["workload"] = cfg.workload;
  summary["precision"] = to_string(cfg.precision);
  for (const auto& p : plugins)
    summary["plugins"][p.kind] = {{"name", p.plugin->info().name}, {"version", p.plugin->info().version}};
  summary["steps"] = trainer.steps_attempted();
  summary["steps_taken"] = trainer.steps_taken();
  summary["skipped_steps"] = trainer.steps_skipped();
  summary["steps_discarded"] = trainer.steps_discarded();
  summary["rollbacks"] = trainer.rollbacks();
  summary["aborted"] = !abort_reason.empty();
  summary["nan_reports"] = nan_reports;
  summary["nan_events"] = nan_events;
  summary["clip_rate"] =
      trainer.steps_taken() ? static_cast<double>(clipped_steps) / trainer.steps_taken() : 0.0;
  summary["final_loss"] =
      recent_losses.empty()
          ? std::numeric_limits<double>::quiet_NaN()
          : std::accumulate(recent_losses.begin(), recent_losses.end(), 0.0) / recent_losses.size();
  if (is_root && abort_reason.empty() && stop_signal == 0) {  // a preempted run has no time to evaluate
    if (auto eval = workload->evaluate(cfg.eval_batches)) {
      summary["test_loss"] = eval->loss;
      summary["test_accuracy"] = eval->accuracy;
      if (eval->perplexity) summary["test_perplexity"] = *eval->perplexity;
    }
  }
  summary["samples_per_second"] =
      train_seconds > 0 ? samples_per_step * (trainer.steps_attempted() - first_step) / train_seconds : 0.0;
  summary["wall_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  summary["param_sha256"] = parameter_sha256(params);
  if (world > 1) {
    // Every rank's parameter hash, so one file shows that the replicas stayed identical.
    const std::string mine = summary["param_sha256"].get<std::string>();
    std::vector<double> codes(mine.begin(), mine.end());
    codes.resize(64, 0.0);
    const std::vector<double> all = gather(*comm, codes, device);
    std::vector<std::string> hashes;
    for (int r = 0; r < world; ++r) {
      std::string h;
      for (int i = 0; i < 64; ++i) h += static_cast<char>(std::lround(all[static_cast<size_t>(r * 64 + i)]));
      hashes.push_back(h);
    }
    summary["world_size"] = world;
    summary["param_sha256_ranks"] = hashes;
    summary["ranks_identical"] =
        std::all_of(hashes.begin(), hashes.end(), [&](const std::string& h) { return h == hashes[0]; });
    summary["rank_samples_per_second"] =
        gather(*comm, {summary["samples_per_second"].get<double>() / world}, device);
    if (!summary["ranks_identical"].get<bool>())
      std::fprintf(stderr, "ampkit-train: warning: rank %d: the ranks' parameters differ at the end (%s)\n",
                   comm->rank(), summary["param_sha256_ranks"].dump().c_str());
  }
  summary["warnings"] = warnings;
  if (summary["final_loss"].is_number_float() && !std::isfinite(summary["final_loss"].get<double>()))
    summary["final_loss"] = "nan";
  if (is_root && !cfg.summary_file.empty()) write_json_file(cfg.summary_file, summary);
  if (is_root) print_summary_table(stdout, summary);
  comm->barrier();  // rank 0 hosts the rendezvous store: it leaves last
  if (!abort_reason.empty()) {
    const bool by_scaler = abort_reason.find("loss scaler: ") != std::string::npos;
    std::fprintf(stderr, "ampkit-train: training aborted by %s '%s' at step %lld: %s\n",
                 by_scaler ? "scaler" : "nan_policy", plugins[by_scaler ? 0 : 2].plugin->info().name.c_str(),
                 static_cast<long long>(trainer.steps_attempted() - 1), abort_reason.c_str());
    return exit_status(ExitCode::aborted);
  }
  if (stop_signal != 0) {
    std::fprintf(stderr, "ampkit-train: interrupted by %s after step %lld%s\n", signal_name(stop_signal),
                 static_cast<long long>(trainer.steps_attempted()),
                 !cfg.checkpoint_dir.empty() && !is_root ? "; rank 0 wrote the checkpoint"
                 : last_checkpoint.empty()               ? " (no --checkpoint-dir: nothing saved)"
                                                         : "; resume with --resume auto");
    return exit_status(ExitCode::interrupted);
  }
  return 0;
}

}  // namespace
}  // namespace ampkit::train

namespace {

// A collective failed in a multi-process run: name the lost rank where the heartbeats tell, exit
// 7 at once (destructors of a broken process group can block), never hang.
[[noreturn]] void exit_lost_rank(const std::string& what, bool distributed_error) {
  ampkit::CommBackend* comm = ampkit::train::g_comm;
  const std::string why = comm->explain_failure(what);
  const bool lost = why.rfind("lost rank", 0) == 0;
  std::fprintf(stderr, "ampkit-train: error: rank %d: %s\n", comm->rank(), why.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(ampkit::exit_status(lost || distributed_error ? ampkit::ExitCode::distributed
                                                           : ampkit::ExitCode::internal));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return ampkit::train::run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-train: error: %s\n", e.what());
    if (ampkit::train::g_comm != nullptr) {  // the other ranks are told by the lost connection
      std::fflush(stderr);
      std::_Exit(ampkit::exit_status(ampkit::exit_code_of(e.category())));
    }
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  } catch (const c10::DistError& e) {
    if (ampkit::train::g_comm != nullptr) exit_lost_rank(e.what_without_backtrace(), true);
    std::fprintf(stderr, "ampkit-train: error: %s\n", e.what_without_backtrace());
    return exit_status(ampkit::ExitCode::distributed);
  } catch (const c10::Error& e) {
    if (ampkit::train::g_comm != nullptr) exit_lost_rank(e.what_without_backtrace(), false);
    std::fprintf(stderr, "ampkit-train: LibTorch error: %s\n", e.what_without_backtrace());
    return exit_status(ampkit::ExitCode::internal);
  } catch (const std::exception& e) {
    if (ampkit::train::g_comm != nullptr) exit_lost_rank(e.what(), false);
    std::fprintf(stderr, "ampkit-train: internal error: %s\n", e.what());
    return exit_status(ampkit::ExitCode::internal);
  }
}
