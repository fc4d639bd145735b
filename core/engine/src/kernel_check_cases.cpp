// The self-check's cases (kernel_self_check.h): the crafted gradients for the statistics kernel and
// the case table for the rules kernel, each run on the device and compared with the host form.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ampkit/grad_stats_chunks.h"
#include "cuda/grad_stats_kernel_abi.h"
#include "cuda/step_rules_abi.h"
#include "kernel_self_check.h"
#include "step_rules_kernel.h"

namespace ampkit {

namespace {

std::string number(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// Per dtype: a 65,736-element view at a storage offset of one element (a whole 65,536-element
// chunk, then a tail of 200, under one block's 256 threads) holding zeros, mixed signs, magnitudes
// from 1e-5 to 1e3 and the dtype's subnormals; 100 elements with +inf and -inf; 100 with two NaNs;
// and an empty tensor.
std::vector<at::Tensor> crafted_gradients(const at::Device& device) {
  const int64_t n = AMPKIT_STATS_CHUNK_ELEMENTS + 200;
  const at::Tensor i = at::arange(n + 1, at::kDouble);
  at::Tensor v = at::sin(i * 0.37) * at::pow(10.0, at::remainder(i, 9) - 5);
  v = at::where(at::remainder(i, 17) == 0, at::zeros_like(v), v);
  std::vector<at::Tensor> grads;
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    at::Tensor base = v.to(dtype);
    base.slice(0, 5, n + 1, 101).fill_(dtype == at::kHalf ? 3e-7 : 1e-40);  // subnormal in the dtype
    grads.push_back(base.to(device).narrow(0, 1, n));
    at::Tensor inf = at::full({100}, 1.5, at::TensorOptions().dtype(dtype));
    inf.narrow(0, 3, 1).fill_(INFINITY);
    inf.narrow(0, 50, 1).fill_(-INFINITY);
    at::Tensor nan = at::full({100}, -2.0, at::TensorOptions().dtype(dtype));
    nan.narrow(0, 7, 1).fill_(NAN);
    nan.narrow(0, 90, 1).fill_(NAN);
    grads.push_back(inf.to(device));
    grads.push_back(nan.to(device));
    grads.push_back(at::empty({0}, at::TensorOptions().dtype(dtype).device(device)));
  }
  return grads;
}

// Every chunk's four numbers as the recipe computes them on `device`: the kernel on a GPU, its
// stand-in (what GradStatsPass runs for CPU tensors) on the CPU.
std::vector<double> chunk_numbers(const StatsPlan& plan, const at::Device& device) {
  std::vector<double> out(4 * plan.chunks.size());
  if (!device.is_cuda()) {
    for (const StatsLaunch& launch : plan.launches)
      for (size_t c = launch.first; c < launch.first + launch.count; ++c)
        chunk_stats_on_host(plan.chunks[c], launch.dtype, out.data() + 4 * c);
    return out;
  }
  const at::Tensor table = upload_chunk_table(plan, device);
  at::Tensor numbers =
      at::zeros({static_cast<int64_t>(out.size())}, at::TensorOptions().dtype(at::kDouble).device(device));
  launch_chunk_kernel(plan, table, numbers);
  // Read once, on first use: not a step's read (host_reads() counts those).
  const at::Tensor host = numbers.cpu();
  std::memcpy(out.data(), host.data_ptr<double>(), out.size() * sizeof(double));
  return out;
}

std::string dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "float" : dtype == at::kHalf ? "half" : "bfloat16";
}

// The float64 sums of the same squares in another order: within n rounding errors of each other.
bool sums_agree(double kernel, double host, int64_t elements) {
  if (std::isnan(kernel) || std::isnan(host)) return std::isnan(kernel) && std::isnan(host);
  if (std::isinf(kernel) || std::isinf(host)) return kernel == host;
  return std::fabs(kernel - host) <= static_cast<double>(elements) * DBL_EPSILON * std::fabs(host);
}

std::string compare_chunks(const StatsPlan& plan, const std::vector<double>& kernel,
                           const std::vector<double>& host) {
  const char* fields[] = {"sum of squares", "max-abs", "zero count", "NaN count"};
  for (const StatsLaunch& launch : plan.launches)
    for (size_t c = launch.first; c < launch.first + launch.count; ++c) {
      const double* k = kernel.data() + 4 * c;
      const double* h = host.data() + 4 * c;
      for (int f = 0; f < 4; ++f) {
        const bool same = f == 0 ? sums_agree(k[0], h[0], plan.chunks[c].elements)
                                 : k[f] == h[f] || (std::isnan(k[f]) && std::isnan(h[f]));
        if (!same)
          return "the statistics kernel disagrees with its host form (chunk_stats_on_host) in its first-use "
                 "self-check: " +
                 dtype_name(launch.dtype) + " chunk " + std::to_string(c) + " of " +
                 std::to_string(plan.chunks[c].elements) + " elements has " + fields[f] + " " + number(k[f]) +
                 " from the kernel, " + number(h[f]) + " on the host";
      }
    }
  return "";
}

}  // namespace

std::string check_stats_kernel(const at::Device& device, bool wrong) {
  const std::vector<at::Tensor> grads = crafted_gradients(device);
  std::vector<at::Tensor> copies;
  for (const at::Tensor& g : grads) copies.push_back(g.cpu().contiguous());
  const StatsPlan plan = plan_stats_chunks(grads), host_plan = plan_stats_chunks(copies);
  std::vector<double> kernel = chunk_numbers(plan, device), host(4 * host_plan.chunks.size());
  for (const StatsLaunch& launch : host_plan.launches)
    for (size_t c = launch.first; c < launch.first + launch.count; ++c)
      chunk_stats_on_host(host_plan.chunks[c], launch.dtype, host.data() + 4 * c);
  if (kernel.size() != host.size()) return "the statistics kernel's self-check planned different chunks";
  if (wrong) kernel[0] *= 1.0 + 1e-3;
  return compare_chunks(plan, kernel, host);
}

}  // namespace ampkit
