// ampkit-bench-post-backward: times what happens to fp32 gradients between backward and the
// optimizer step: ampkit's two passes, PyTorch's GradScaler + clip_grad_norm_ sequence, and the
// bytes-moved floor of this machine, on the same gradients in one run. A program, not a test.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/utsname.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ampkit/grad_stats.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int reps = 21;
  int warmup = 3;
  int threads = 0;  // 0: LibTorch's choice
  double scale = 65536.0;
  double max_norm = 1.0;
  std::vector<int64_t> mlp;  // --mlp WIDTH,DEPTH,INPUTS,CLASSES: the synthetic MLP's gradients instead
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "ampkit-bench-post-backward: %s\n"
               "usage: ampkit-bench-post-backward [--reps N] [--warmup N] [--threads N]\n"
               "                                  [--mlp WIDTH,DEPTH,INPUTS,CLASSES]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0 || v > 100000) usage(("bad value for " + a).c_str());
      return static_cast<int>(v);
    };
    if (a == "--reps")
      o.reps = std::max(1, next());
    else if (a == "--warmup")
      o.warmup = next();
    else if (a == "--threads")
      o.threads = next();
    else if (a == "--mlp") {
      if (i + 1 >= argc) usage("missing value after --mlp");
      std::stringstream list(argv[++i]);
      std::string item;
      while (std::getline(list, item, ',')) {
        char* end = nullptr;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > 1000000) usage("bad value for --mlp");
        o.mlp.push_back(v);
      }
      if (o.mlp.size() != 4) usage("--mlp takes WIDTH,DEPTH,INPUTS,CLASSES");
    } else if (a == "--help" || a == "-h")
      usage("times the post-backward gradient pipeline");
    else
      usage(("unknown argument " + a).c_str());
  }
  return o;
}

// 128 tensors shaped like the layers of a mid-sized model: a mix of big matrices, small
// matrices, and bias-sized vectors (33.7M elements, 135 MB of fp32). With --mlp, the gradients of
// ampkit-train's synthetic MLP (--synthetic-width/-depth/-inputs/-classes): few, large tensors.
std::vector<int64_t> tensor_sizes(const std::vector<int64_t>& mlp) {
  std::vector<int64_t> sizes;
  if (!mlp.empty()) {
    const int64_t width = mlp[0], depth = mlp[1], inputs = mlp[2], classes = mlp[3];
    sizes = {inputs * width, width};
    for (int64_t d = 1; d < depth; ++d) sizes.insert(sizes.end(), {width * width, width});
    sizes.insert(sizes.end(), {width * classes, classes});
    return sizes;
  }
  const int64_t pattern[] = {768 * 512, 4096, 768 * 768, 256 * 256};
  for (int i = 0; i < 128; ++i) sizes.push_back(pattern[i % 4]);
  return sizes;
}

std::string cpu_line(const char* key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  return "";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A read pass at memory speed: the float sum of every element with AVX2 (the least work a
// read can do, so the pass is bound by memory only), chunks over threads.
__attribute__((target("avx2"))) float sum_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
}

double read_pass(const std::vector<at::Tensor>& grads) {
  constexpr int64_t kChunk = 1 << 16;
  double total = 0;
  for (const auto& g : grads) {
    const float* p = g.data_ptr<float>();
    const int64_t n = g.numel();
    std::vector<float> parts(static_cast<size_t>((n + kChunk - 1) / kChunk));
    at::parallel_for(0, static_cast<int64_t>(parts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k)
        parts[static_cast<size_t>(k)] = sum_avx2(p + k * kChunk, std::min(kChunk, n - k * kChunk));
    });
    for (float s : parts) total += s;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.threads > 0) at::set_num_threads(opt.threads);
  at::manual_seed(0);

  const std::vector<int64_t> sizes = tensor_sizes(opt.mlp);
  int64_t elements = 0;
  std::vector<at::Tensor> params, grads, source;
  for (int64_t n : sizes) {
    elements += n;
    at::Tensor p = at::zeros({n}, at::kFloat);
    // Scaled gradients as a GradScaler backward leaves them: N(0, 1e-3) * scale.
    at::Tensor s = at::randn({n}, at::kFloat) * (1e-3 * opt.scale);
    p.mutable_grad() = at::empty({n}, at::kFloat);
    params.push_back(p);
    grads.push_back(p.mutable_grad());
    source.push_back(s);
  }
  const double bytes = static_cast<double>(elements) * sizeof(float);

  // Each way runs on fresh scaled gradients, copied in before the clock starts.
  auto refresh = [&] { at::_foreach_copy_(grads, source); };

  double sink = 0;  // keeps results observable
  std::vector<at::Tensor> after_ampkit, after_torch;

  // (a) ampkit: one statistics pass, the norm clipper's coefficient, one multiply pass.
  auto ampkit_way = [&] {
    const ampkit::GradStats stats = ampkit::compute_grad_stats(grads);
    if (!stats.finite()) return;  // the step would be skipped: nothing to scale
    const double norm = std::sqrt(stats.sum_squares) / opt.scale;
    const double coef = std::min(1.0, opt.max_norm / (norm + 1e-6));  // as clipper 'norm' computes it
    ampkit::scale_grads_(grads, coef / opt.scale);
    sink += norm;
  };
  auto ampkit_stats_only = [&] { sink += ampkit::compute_grad_stats(grads).sum_squares; };
  auto ampkit_scale_only = [&] { ampkit::scale_grads_(grads, 0.5 / opt.scale); };

  // (b) PyTorch: GradScaler.unscale_ (one fused check-and-multiply per tensor, then found_inf
  // is read by step()), then python's clip_grad_norm_ as of torch 2.11: _foreach_norm, the norm
  // of the stacked norms, clamp(max_norm / (norm + 1e-6), max=1), _foreach_mul_.
  at::Tensor found_inf = at::zeros({1}, at::kFloat);
  const at::Tensor inv_scale = at::full({1}, 1.0 / opt.scale, at::kFloat);
  auto unscale = [&] {
    found_inf.zero_();
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return found_inf.item<float>() == 0.0f;
  };
  auto torch_way = [&] {
    if (!unscale()) return;
    const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
    const at::Tensor coef = at::clamp(opt.max_norm / (total + 1e-6), c10::nullopt, 1.0);
    at::_foreach_mul_(grads, coef);
    sink += total.item<double>();
  };
  // The same with the C++ API's torch::nn::utils::clip_grad_norm_, which differs from python's:
  // a per-tensor norm() and a per-tensor mul_ instead of the foreach kernels.
  auto torch_cpp_way = [&] {
    if (!unscale()) return;
    sink += torch::nn::utils::clip_grad_norm_(params, opt.max_norm, 2.0);
  };
  // An fp32 loop has nothing to unscale: clip_grad_norm_ is its whole post-backward work, the
  // counterpart of ampkit's way in fp32 and bf16 (whose scale is 1).
  auto torch_cpp_clip_only = [&] { sink += torch::nn::utils::clip_grad_norm_(params, opt.max_norm, 2.0); };

  // (c) The floor: one read pass and one read-write pass over the same bytes.
  auto floor_read = [&] { sink += read_pass(grads); };
  auto floor_read_foreach_norm = [&] { sink += at::_foreach_norm(grads, 2)[0].item<double>(); };
  auto floor_write = [&] { at::_foreach_mul_(grads, at::Scalar(0.5)); };

  struct Way {
    const char* name;
    std::function<void()> run;
    double traffic;  // minimal bytes moved, in units of the gradient bytes
    std::vector<double> ms;
  };
  // The device statistics path on these CPU tensors: its CPU recipe (the fused scan
  // packed into one read) and the GPU's multi-tensor recipe forced here.
  auto device_way = [&](ampkit::DeviceStatsRecipe recipe) {
    return [&, recipe] {
      std::vector<double> none;
      const ampkit::GradStats stats = ampkit::compute_grad_stats_on_device(grads, {}, none, recipe);
      if (!stats.finite()) return;
      const double norm = std::sqrt(stats.sum_squares) / opt.scale;
      ampkit::scale_grads_(grads, std::min(1.0, opt.max_norm / (norm + 1e-6)) / opt.scale);
      sink += norm;
    };
  };
  // Rows by position: ampkit 0, torch 1, the floor's parts kReadAvx2..kWrite (its row prints first).
  std::vector<Way> ways = {
      {"ampkit: stats + clip coef + scale_grads_", ampkit_way, 3, {}},
      {"torch: unscale_ + clip_grad_norm_ (python 2.11: foreach)", torch_way, 5, {}},
      {"torch: unscale_ + C++ nn::utils::clip_grad_norm_", torch_cpp_way, 5, {}},
      {"torch: C++ nn::utils::clip_grad_norm_ alone (no scale)", torch_cpp_clip_only, 3, {}},
      {"floor read: AVX2 float sum (parallel_for)", floor_read, 1, {}},
      {"floor read: at::_foreach_norm", floor_read_foreach_norm, 1, {}},
      {"floor read-write: at::_foreach_mul_", floor_write, 2, {}},
      {"ampkit part: compute_grad_stats", ampkit_stats_only, 1, {}},
      {"ampkit part: scale_grads_", ampkit_scale_only, 2, {}},
      {"ampkit device path, fused_scan (a CPU's) + coef + scale",
       device_way(ampkit::DeviceStatsRecipe::fused_scan),
       3,
       {}},
      {"ampkit device path, foreach_ops (a GPU's) + coef + scale",
       device_way(ampkit::DeviceStatsRecipe::foreach_ops),
       7,
       {}},
  };
  constexpr size_t kReadAvx2 = 4, kReadForeach = 5, kWrite = 6;

  // Parity of the two pipelines on the same input (the benchmark is only fair if they agree).
  refresh();
  ampkit_way();
  after_ampkit = {grads[0].clone(), grads[1].clone()};
  refresh();
  torch_way();
  const double parity =
      std::max((after_ampkit[0] - grads[0]).abs().max().item<double>() / grads[0].abs().max().item<double>(),
               (after_ampkit[1] - grads[1]).abs().max().item<double>() / grads[1].abs().max().item<double>());

  const std::string load_before = load_average();
  // Ways interleave within each repetition, so a burst of load on a shared machine hits all.
  for (int rep = 0; rep < opt.warmup + opt.reps; ++rep) {
    for (auto& w : ways) {
      refresh();
      const auto t0 = Clock::now();
      w.run();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (rep >= opt.warmup) w.ms.push_back(ms);
    }
  }
  const std::string load_after = load_average();

  std::vector<double> med, fastest;
  for (const auto& w : ways) {
    med.push_back(median(w.ms));
    fastest.push_back(*std::min_element(w.ms.begin(), w.ms.end()));
  }
  const double t_ampkit = med[0], t_torch = med[1];
  // The floor: the faster read pass plus the read-write pass.
  const double t_read = std::min(med[kReadAvx2], med[kReadForeach]);
  const double t_floor = t_read + med[kWrite];

  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  utsname un{};
  ::uname(&un);
  const std::string flags = " " + cpu_line("flags") + " ";
  const std::string isa = flags.find(" avx512f ") != std::string::npos ? "AVX-512"
                          : flags.find(" avx2 ") != std::string::npos  ? "AVX2"
                                                                       : "no AVX2";
  std::printf("ampkit-bench-post-backward  %s\n", date);
  std::printf("machine: %s (%s), %u hardware threads, LibTorch threads %d, %s %s, torch %s\n",
              cpu_line("model name").c_str(), isa.c_str(), std::thread::hardware_concurrency(),
              at::get_num_threads(), un.sysname, un.release, TORCH_VERSION);
  std::printf(
      "gradients: %zu fp32 tensors, %lld elements (%.1f MB), loss scale %g, max_norm %g (clipping active)\n",
      sizes.size(), static_cast<long long>(elements), bytes / 1e6, opt.scale, opt.max_norm);
  std::printf(
      "timing: median of %d repetitions after %d warm-up, fresh scaled gradients copied in before each "
      "(not timed); load average %s before, %s after\n",
      opt.reps, opt.warmup, load_before.c_str(), load_after.c_str());
  std::printf("parity: ampkit vs torch result, max relative difference %.2e\n\n", parity);
  std::printf("%-58s %9s %8s %7s %10s %9s %8s\n", "way", "ms", "traffic", "GB/s", "vs torch", "vs floor",
              "min ms");
  for (size_t i = 0; i < ways.size(); ++i) {
    if (i == kReadAvx2)
      std::printf("%-58s %9.2f %8s %7.1f %9.2fx %8.2fx %8s\n", "floor: best read + read-write", t_floor, "3x",
                  3 * bytes / (t_floor * 1e6), t_torch / t_floor, 1.0, "");
    const auto& w = ways[i];
    char traffic[16];
    std::snprintf(traffic, sizeof traffic, "%gx", w.traffic);
    std::printf("%-58s %9.2f %8s %7.1f %9.2fx %8.2fx %8.2f\n", w.name, med[i], traffic,
                w.traffic * bytes / (med[i] * 1e6), t_torch / med[i], med[i] / t_floor, fastest[i]);
  }
  std::printf(
      "\ntraffic: minimal bytes moved by the way, in units of the gradient bytes (%.1f MB): a read pass\n"
      "counts 1, a read-write pass 2. ampkit = stats read (1) + scale read-write (2) = 3; torch = unscale\n"
      "read-write (2) + norm read (1) + mul read-write (2) = 5; floor = 3; the device path's foreach_ops\n"
      "recipe = norm, max-abs, sign and signs' norm reads (4) + sign write (1) + scale (2) = 7. GB/s = "
      "traffic / time.\n"
      "vs torch = torch (python 2.11 sequence) time / this time (higher is faster); vs floor = this time /\n"
      "floor time (1.00 is the floor). ms is the median; min ms the fastest repetition.\n",
      bytes / 1e6);
  std::printf(
      "\nampkit %.2fx faster than torch (target >= 1.5x): %s; %.2fx the floor (target <= 1.25x): %s\n",
      t_torch / t_ampkit, t_torch / t_ampkit >= 1.5 ? "met" : "MISSED", t_ampkit / t_floor,
      t_ampkit / t_floor <= 1.25 ? "met" : "MISSED");
  if (sink == 12345.678) std::printf(" \n");
  return 0;
}
