// ampkit-bench-post-backward-device: the post-backward gradient pipeline on a GPU:
// ampkit's device path (one statistics pass of foreach kernels packed into one host read, the
// clip coefficient, one multiply) and PyTorch's GradScaler.unscale_ + clip_grad_norm_ sequence
// (python 2.11's foreach kernels), against the device's own copy bandwidth measured on the same
// bytes. A program, not a test: tools/gpu-check.sh runs it on a GPU machine.
//
//   ampkit-bench-post-backward-device [--device cuda|cpu] [--reps N] [--warmup N] [--tensors N]
//
// --tensors N cuts the same 33.7M elements into N equal gradients (default: the 128 tensors of
// ampkit-bench-post-backward): the device path's time should not grow with N.
//
// Without a GPU, --device cuda prints one line and exits 0; --device cpu runs the same code on
// CPU tensors (the device path forced), so the program is exercised where there is none.
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = "cuda";
  int reps = 51;
  int warmup = 5;
  double scale = 65536.0;
  double max_norm = 1.0;
  int tensors = 128;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "ampkit-bench-post-backward-device: %s\n"
      "usage: ampkit-bench-post-backward-device [--device cuda|cpu] [--reps N] [--warmup N] [--tensors N]\n",
      why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("times the post-backward gradient pipeline on a device");
    if (i + 1 >= argc) usage("missing value after " + a + " (or unknown argument)");
    const std::string v = argv[++i];
    if (a == "--device") {
      if (v != "cuda" && v != "cpu") usage("--device takes cuda or cpu, not '" + v + "'");
      o.device = v;
      continue;
    }
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0' || v.empty() || n < 0 || n > 100000) usage("bad value for " + a + ": '" + v + "'");
    if (a == "--reps")
      o.reps = std::max(1, static_cast<int>(n));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(n);
    else if (a == "--tensors" && n >= 1)
      o.tensors = static_cast<int>(n);
    else
      usage("unknown argument " + a);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.device == "cuda" && !torch::cuda::is_available()) {
    std::printf(
        "no GPU: nothing to measure (LibTorch sees no CUDA device; --device cpu runs it on the CPU)\n");
    return 0;
  }
  const bool cuda = opt.device == "cuda";
  const at::TensorOptions on =
      at::TensorOptions(cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU)).dtype(at::kFloat);
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  at::manual_seed(0);

  // The 128 tensors of ampkit-bench-post-backward: big and small matrices and bias-sized vectors,
  // 33.7M elements (135 MB of fp32), scaled as a GradScaler backward leaves them; or the same
  // elements in --tensors equal parts.
  const int64_t pattern[] = {768 * 512, 4096, 768 * 768, 256 * 256};
  const int64_t total = 32 * (pattern[0] + pattern[1] + pattern[2] + pattern[3]);
  std::vector<at::Tensor> grads, source;
  int64_t elements = 0;
  for (int i = 0; i < opt.tensors; ++i) {
    const int64_t n = opt.tensors == 128 ? pattern[i % 4] : total / opt.tensors;
    elements += n;
    grads.push_back(at::empty({n}, on));
    source.push_back(at::randn({n}, on) * (1e-3 * opt.scale));
  }
  const double bytes = static_cast<double>(elements) * sizeof(float);
  at::Tensor flat_src = at::randn({elements}, on), flat_dst = at::empty({elements}, on);

  double sink = 0;
  // (a) ampkit's device path: stats and one host read, the norm clipper's coefficient, one multiply;
  // with the recipe a GPU runs and, on CPU tensors, with the CPU's fused scan too.
  auto ampkit_way = [&](ampkit::DeviceStatsRecipe recipe) {
    return [&, recipe] {
      std::vector<double> scalars;
      const ampkit::GradStats stats = ampkit::compute_grad_stats_on_device(grads, {}, scalars, recipe);
      if (!stats.finite()) return;
      const double norm = std::sqrt(stats.sum_squares) / opt.scale;
      const double coef = std::min(1.0, opt.max_norm / (norm + 1e-6));
      ampkit::scale_grads_(grads, coef / opt.scale);
      sink += norm;
    };
  };
  // (b) PyTorch: GradScaler.unscale_ (fused check-and-unscale; step() reads found_inf), then
  // clip_grad_norm_ as python 2.11 runs it: _foreach_norm, norm of the norms, clamp, _foreach_mul_.
  at::Tensor found_inf = at::zeros({1}, on);
  const at::Tensor inv_scale = at::full({1}, 1.0 / opt.scale, on);
  auto torch_way = [&] {
    found_inf.zero_();
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    if (found_inf.item<float>() != 0.0f) return;
    const at::Tensor total = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
    at::_foreach_mul_(grads, at::clamp(opt.max_norm / (total + 1e-6), c10::nullopt, 1.0));
  };
  // (c) The device's copy bandwidth on the same bytes: one read and one write.
  auto copy_way = [&] { flat_dst.copy_(flat_src); };

  struct Way {
    const char* name;
    std::function<void()> run;
    double traffic;  // minimal bytes moved, in gradient bytes
    std::vector<double> ms;
  };
  // traffic: the bytes each way moves, in gradient bytes: the foreach recipe reads four times
  // (norm, max-abs, sign, signs' norm), writes the signs once, then multiplies (read-write): 7.
  std::vector<Way> ways = {{"torch: unscale_ + clip_grad_norm_ (python 2.11: foreach)", torch_way, 5, {}},
                           {"copy: flat tensor copy_ (the device's bandwidth)", copy_way, 2, {}},
                           {"ampkit: device stats, foreach_ops (a GPU's) + coef + scale_grads_",
                            ampkit_way(ampkit::DeviceStatsRecipe::foreach_ops),
                            7,
                            {}}};
  if (!cuda)
    ways.push_back({"ampkit: device stats, fused_scan (a CPU's) + coef + scale_grads_",
                    ampkit_way(ampkit::DeviceStatsRecipe::fused_scan),
                    3,
                    {}});
  // The one-read kernel (on CPU tensors its chunks are computed on the host, one thread).
  if (!cuda || ampkit::chunk_kernel_built())
    ways.push_back(
        {cuda ? "ampkit: device stats, chunk_kernel (one read) + coef + scale_grads_"
              : "ampkit: device stats, chunk_kernel (host emulation, 1 thread) + coef + scale_grads_",
         ampkit_way(ampkit::DeviceStatsRecipe::chunk_kernel),
         3,
         {}});
  for (int rep = 0; rep < opt.warmup + opt.reps; ++rep)
    for (auto& w : ways) {
      at::_foreach_copy_(grads, source);
      sync();
      const auto t0 = Clock::now();
      w.run();
      sync();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (rep >= opt.warmup) w.ms.push_back(ms);
    }

  const double copy_gbs = 2 * bytes / (median(ways[1].ms) * 1e6);
  std::printf("ampkit-bench-post-backward-device  torch %s, device %s\n", TORCH_VERSION, opt.device.c_str());
  std::printf(
      "gradients: %d fp32 tensors, %lld elements (%.1f MB), loss scale %g, max_norm %g; median of %d "
      "repetitions after %d warm-up, each ending in a device synchronisation\n\n",
      opt.tensors, static_cast<long long>(elements), bytes / 1e6, opt.scale, opt.max_norm, opt.reps,
      opt.warmup);
  std::printf("%-68s %9s %8s %8s %10s %10s\n", "way", "ms", "traffic", "GB/s", "vs torch", "of copy");
  for (const auto& w : ways) {
    const double ms = median(w.ms), gbs = w.traffic * bytes / (ms * 1e6);
    char traffic[16];
    std::snprintf(traffic, sizeof traffic, "%gx", w.traffic);
    std::printf("%-68s %9.3f %8s %8.1f %9.2fx %9.0f%%\n", w.name, ms, traffic, gbs, median(ways[0].ms) / ms,
                100.0 * gbs / copy_gbs);
  }
  std::printf(
      "\ntraffic: bytes the way moves in units of the gradient bytes (read 1, read-write 2); GB/s =\n"
      "traffic / time; of copy = that rate as a share of the copy's (the device's practical bandwidth).\n");
  if (sink == 12345.678) std::printf(" \n");
  return 0;
}
