// The hand-written LibTorch loop ampkit-train is measured against (docs/benchmarks.md): the same
// workloads, data and math — autocast, scaled backward, GradScaler's unscale + inf check and
// scale update, clip_grad_norm_, AdamW — written the way a LibTorch user would, no framework.
//
//   ampkit-bench-handwritten [ampkit-train options] --warmup N
//
// Accepts ampkit-train's options (same parser; plugin choices are ignored: fp16 uses a dynamic
// scale from 65536 with GradScaler's defaults, every precision clips the norm at 1.0) and prints
// one JSON line with the throughput of the steps after the warm-up.
#include <ATen/Parallel.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/exit_codes.h"
#include "config/train_config.h"
#include "handwritten_step.h"
#include "workloads/registry.h"
#include "workloads/workload.h"

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run(int argc, char** argv) {
  int64_t warmup = 3;
  std::vector<const char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--warmup") == 0 && i + 1 < argc) {
      warmup = ampkit::bench::count_option("--warmup", argv[++i]);
      continue;
    }
    args.push_back(argv[i]);
  }
  const ampkit::TrainConfig cfg = ampkit::parse_train_config(static_cast<int>(args.size()), args.data());
  if (cfg.device != "cpu")
    throw ampkit::Error(ampkit::ErrorCategory::usage, "the hand-written loop runs on --device cpu");
  if (cfg.threads > 0) at::set_num_threads(cfg.threads);
  torch::manual_seed(cfg.seed);
  const at::Device device(at::kCPU);
  std::unique_ptr<ampkit::train::Workload> w = ampkit::train::make_workload(cfg, device);
  std::vector<at::Tensor> params;
  int64_t count = 0;
  for (const auto& [name, p] : w->model().named_parameters()) {
    params.push_back(p);
    count += p.numel();
  }
  // torch::optim::AdamW: what a LibTorch user writes (ampkit-train's is the fused kernel).
  ampkit::bench::HandWrittenStep hand_written(params, cfg, /*fused=*/false);

  const int64_t steps_per_epoch = w->batches_per_epoch() / cfg.accumulate;
  const int64_t steps = cfg.steps > 0 ? cfg.steps : cfg.epochs * steps_per_epoch;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int64_t epoch = -1, skipped = 0;
  std::vector<double> step_ms;  // each timed step's duration: their median ignores bursts of load
  for (int64_t step = 0; step < warmup + steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    if (step == warmup) start = step_start;
    if (step / steps_per_epoch != epoch) w->start_epoch(epoch = step / steps_per_epoch);
    const int64_t first = (step % steps_per_epoch) * cfg.accumulate;
    if (!hand_written.step(*w, first)) ++skipped;
    if (step >= warmup)
      step_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start).count());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double samples = static_cast<double>(steps * cfg.batch_size * cfg.accumulate);
  std::printf(
      "{\"way\": \"libtorch\", \"workload\": \"%s\", \"precision\": \"%s\", \"steps\": %lld, \"seconds\": "
      "%.6f, "
      "\"samples_per_second\": %.3f, \"step_ms\": %.4f, \"median_step_ms\": %.4f, \"parameters\": %lld, "
      "\"skipped_steps\": %lld}\n",
      cfg.workload.c_str(), ampkit::to_string(cfg.precision), static_cast<long long>(steps), seconds,
      samples / seconds, 1000.0 * seconds / static_cast<double>(steps), median(step_ms),
      static_cast<long long>(count), static_cast<long long>(skipped));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-bench-handwritten: error: %s\n", e.what());
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampkit-bench-handwritten: error: %s\n", e.what());
    return 1;
  }
}
