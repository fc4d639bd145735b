// What the framework costs per step, measured so that this VM's noise cancels (docs/benchmarks.md):
// one process holds two copies of the same workload (same seed, same batches) and trains them
// step by step in alternation, one through ampkit (plugins loaded by name, ampkit::Trainer, the
// metrics record ampkit-train writes) and one through a hand-written LibTorch step doing the same
// math (autocast, scaled backward, GradScaler's unscale + inf check and scale update,
// clip_grad_norm_, the same optimizer). A burst of load from elsewhere, or a slow page placement,
// then hits both ways alike; the ratio of each pair's step times is the framework's cost.
//
//   ampkit-bench-overhead [ampkit-train options] [--pairs 200] [--warmup 5]
//                         [--loop-optimizer fused|adamw] [--loop-first]
//
// Accepts ampkit-train's options (same parser and plugin selection, --metrics default: a temporary
// file) and prints one JSON line: each way's median step, the median of the per-pair ratios
// ampkit/loop with a 95% bootstrap interval, and how far apart the two models ended up.
#include <ATen/Parallel.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/exit_codes.h"
#include "ampkit/fused_adamw.h"
#include "ampkit/metrics.h"
#include "ampkit/outcome_record.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/trainer.h"
#include "config/train_config.h"
#include "handwritten_step.h"
#include "workloads/registry.h"
#include "workloads/workload.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Minor page faults of the whole process so far (a step that faults in fresh pages pays the
// kernel's clear_page: the allocator's reuse of freed blocks shows here).
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// 2.5% and 97.5% quantiles of the median over resamples of `v` (fixed seed: reproducible).
std::pair<double, double> bootstrap_median_interval(const std::vector<double>& v) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<size_t> pick(0, v.size() - 1);
  std::vector<double> medians, sample(v.size());
  for (int r = 0; r < 2000; ++r) {
    for (double& s : sample) s = v[pick(rng)];
    medians.push_back(median(sample));
  }
  std::sort(medians.begin(), medians.end());
  return {medians[50], medians[1949]};
}

std::unique_ptr<ampkit::train::Workload> make_workload(const ampkit::TrainConfig& cfg) {
  torch::manual_seed(cfg.seed);  // both copies start from the same initial values
  const at::Device cpu(at::kCPU);
  return ampkit::train::make_workload(cfg, cpu);
}

std::vector<at::Tensor> parameters_of(ampkit::train::Workload& w) {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : w.model().named_parameters()) out.push_back(p);
  return out;
}

// The hand-written step (handwritten_step.h) on its own copy of the workload.
struct HandWrittenLoop {
  HandWrittenLoop(const ampkit::TrainConfig& cfg, bool fused)
      : workload(make_workload(cfg)), step(parameters_of(*workload), cfg, fused) {}
  std::unique_ptr<ampkit::train::Workload> workload;
  ampkit::bench::HandWrittenStep step;
};

int run(int argc, char** argv) {
  int64_t pairs = 200, warmup = 5;
  std::string loop_optimizer = "fused";
  bool loop_first = false;
  std::vector<const char*> args;
  for (int i = 0; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--pairs") == 0 && has_value) {
      pairs = ampkit::bench::count_option("--pairs", argv[++i]);
    } else if (std::strcmp(argv[i], "--warmup") == 0 && has_value) {
      warmup = ampkit::bench::count_option("--warmup", argv[++i]);
    } else if (std::strcmp(argv[i], "--loop-first") == 0) {
      loop_first = true;
    } else if (std::strcmp(argv[i], "--loop-optimizer") == 0 && has_value) {
      loop_optimizer = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  if (pairs < 2 || warmup < 0)
    throw ampkit::Error(ampkit::ErrorCategory::usage, "--pairs must be >= 2 and --warmup >= 0");
  if (loop_optimizer != "fused" && loop_optimizer != "adamw")
    throw ampkit::Error(ampkit::ErrorCategory::usage,
                        "--loop-optimizer must be fused or adamw, got '" + loop_optimizer + "'");
  ampkit::TrainConfig cfg = ampkit::parse_train_config(static_cast<int>(args.size()), args.data());
  if (cfg.device != "cpu" || cfg.optimizer != "adamw" || cfg.dist.world_size != 1)
    throw ampkit::Error(ampkit::ErrorCategory::usage,
                        "the overhead benchmark runs one rank on --device cpu with --optimizer adamw");
  if (cfg.threads > 0) at::set_num_threads(cfg.threads);
  // ampkit-train's malloc settings (hosts/train/src/main.cpp); both ways share them here.
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables == nullptr || std::strstr(tunables, "glibc.malloc.") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }

  // ampkit's side, set up as ampkit-train sets it up: plugins by name, options resolved.
  ampkit::RegistryOptions registry_options;
  for (const auto& d : cfg.plugin_dirs) registry_options.plugin_dirs.emplace_back(d);
  registry_options.allow_untrusted = cfg.allow_untrusted_plugins;
  ampkit::Registry registry(registry_options);
  std::vector<ampkit::PluginInfo> selected;
  for (const auto& kind : ampkit::kKinds)  // the four step kinds, as ampkit-train selects them
    if (!ampkit::optional_kind(kind)) selected.push_back(registry.find(kind.name, cfg.plugins[kind.name]));
  const std::vector<const ampkit::LoadedPlugin*> loaded = registry.load_all(selected);
  std::vector<std::unique_ptr<ampkit::Strategy>> strategies;
  for (size_t i = 0; i < loaded.size(); ++i) {
    ampkit::OptionInputs inputs;
    inputs.command_line = cfg.plugin_options_cli[ampkit::kKinds[i].name];
    inputs.precision = cfg.precision;
    strategies.push_back(loaded[i]->create(ampkit::resolve_options(loaded[i]->descriptor(), inputs).values));
  }
  auto* comm = static_cast<ampkit::CommBackend*>(strategies[3].get());
  comm->init(cfg.dist);
  // Which copy of the model is allocated first (its tensors get the lower addresses): where a
  // kernel's speed depends on its buffers' placement, swapping this shows it.
  std::unique_ptr<HandWrittenLoop> loop;
  if (loop_first) loop = std::make_unique<HandWrittenLoop>(cfg, loop_optimizer == "fused");
  std::unique_ptr<ampkit::train::Workload> workload = make_workload(cfg);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : workload->model().named_parameters()) {
    names.push_back(name);
    params.push_back(p);
  }
  ampkit::FusedAdamW optimizer(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  ampkit::LrSchedule schedule;
  schedule.base_lr = cfg.lr;
  ampkit::Trainer trainer(cfg.precision, cfg.accumulate, params, names, optimizer,
                          {static_cast<ampkit::LossScaler*>(strategies[0].get()),
                           static_cast<ampkit::GradClipper*>(strategies[1].get()),
                           static_cast<ampkit::NanPolicy*>(strategies[2].get()), comm},
                          schedule);
  trainer.start(ampkit::RunInfo{});
  const bool own_metrics = cfg.metrics_file.empty();
  const std::filesystem::path metrics_path =
      own_metrics ? std::filesystem::temp_directory_path() /
                        ("ampkit-bench-overhead-" + std::to_string(::getpid()) + ".jsonl")
                  : std::filesystem::path(cfg.metrics_file);
  // A temporary metrics file goes away however the run ends (an error in a step included).
  struct RemoveOnExit {
    std::filesystem::path path;
    ~RemoveOnExit() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove(path, ignored);
    }
  } remove_metrics{own_metrics ? metrics_path : std::filesystem::path()};
  ampkit::MetricsWriter metrics(metrics_path);

  if (!loop) loop = std::make_unique<HandWrittenLoop>(cfg, loop_optimizer == "fused");

  const int64_t steps_per_epoch = workload->batches_per_epoch() / cfg.accumulate;
  if (steps_per_epoch < 1)
    throw ampkit::Error(ampkit::ErrorCategory::usage,
                        "--batch-size x --accumulate exceeds one epoch of " + cfg.workload);
  const double samples_per_step = static_cast<double>(cfg.batch_size * cfg.accumulate);
  const auto start = Clock::now();
  std::vector<double> ampkit_ms, loop_ms, ratios;
  long ampkit_faults = 0, loop_faults = 0;
  int64_t epoch = -1;
  for (int64_t step = 0; step < warmup + pairs; ++step) {
    if (step / steps_per_epoch != epoch) {
      epoch = step / steps_per_epoch;
      workload->start_epoch(epoch);
      loop->workload->start_epoch(epoch);
    }
    const int64_t first_batch = (step % steps_per_epoch) * cfg.accumulate;
    auto ampkit_step = [&] {
      const long faults = minor_faults();
      const auto t = Clock::now();
      const ampkit::StepOutcome out =
          trainer.step([&](int micro) { return workload->loss(first_batch + micro); });
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      ampkit::StepRecord record =
          ampkit::step_record(out, epoch, trainer.steps_skipped(), samples_per_step, elapsed);
      record.data_step = step;
      record.steps_discarded = trainer.steps_discarded();
      record.rollbacks = trainer.rollbacks();
      if (cfg.layer_norms_top_k > 0)
        record.top_layers = ampkit::top_layers(names, out.stats.tensor_norms, cfg.layer_norms_top_k);
      metrics.write(record);
      const double ms = ms_since(t);
      if (step >= warmup) ampkit_faults += minor_faults() - faults;
      return ms;
    };
    auto loop_step = [&] {
      const long faults = minor_faults();
      const auto t = Clock::now();
      loop->step.step(*loop->workload, first_batch);
      const double ms = ms_since(t);
      if (step >= warmup) loop_faults += minor_faults() - faults;
      return ms;
    };
    double a = 0, b = 0;
    if (step % 2 == 0) {  // ABBA: neither way always runs first (caches, a drifting load)
      a = ampkit_step();
      b = loop_step();
    } else {
      b = loop_step();
      a = ampkit_step();
    }
    if (step < warmup) continue;
    ampkit_ms.push_back(a);
    loop_ms.push_back(b);
    ratios.push_back(a / b);
  }

  double max_diff = 0;  // the same math on the same batches: the models should barely differ
  for (size_t i = 0; i < params.size(); ++i)
    max_diff = std::max(max_diff, (params[i] - loop->step.parameters()[i]).abs().max().item<double>());
  const auto [low, high] = bootstrap_median_interval(ratios);
  nlohmann::json result = {
      {"workload", cfg.workload},
      {"precision", ampkit::to_string(cfg.precision)},
      {"pairs", pairs},
      {"threads", at::get_num_threads()},
      {"allocated_first", loop_first ? "loop" : "ampkit"},
      {"loop_optimizer", loop_optimizer == "fused" ? "FusedAdamW" : "torch::optim::AdamW"},
      {"ampkit_median_step_ms", median(ampkit_ms)},
      {"loop_median_step_ms", median(loop_ms)},
      {"median_ratio", median(ratios)},
      {"ratio_interval_95", {low, high}},
      {"ampkit_minor_faults_per_step", static_cast<double>(ampkit_faults) / pairs},
      {"loop_minor_faults_per_step", static_cast<double>(loop_faults) / pairs},
      {"steps_skipped", trainer.steps_skipped()},
      {"max_parameter_difference", max_diff}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-bench-overhead: error: %s\n", e.what());
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampkit-bench-overhead: error: %s\n", e.what());
    return 1;
  }
}
