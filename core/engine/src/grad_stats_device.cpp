// The device path of the statistics pass: a number of kernels that grows with bytes
// and dtypes, never with the number of gradients, packed into one host read.
#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/gradient_table.h"
#include "ampkit/host_reads.h"
#include "ampkit/kernel_check.h"
#include "stats_recipes.h"

namespace ampkit {

namespace {

// The largest temporary (the signs of one group) and the largest part of one gradient.
constexpr int64_t kGroupBytes = int64_t{64} << 20;

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// A gradient, or a contiguous view of at most kGroupBytes of one.
struct Part {
  size_t tensor;
  at::Tensor data;
};

std::vector<Part> cut_into_parts(const std::vector<at::Tensor>& grads) {
  std::vector<Part> parts;
  for (size_t t = 0; t < grads.size(); ++t) {
    const at::Tensor& g = grads[t];
    if (!g.defined() || g.numel() == 0) continue;
    if (bytes_of(g) <= kGroupBytes || !g.is_contiguous()) {
      parts.push_back({t, g});
      continue;
    }
    const at::Tensor flat = g.view({-1});
    const int64_t step = kGroupBytes / static_cast<int64_t>(g.element_size());
    for (int64_t begin = 0; begin < g.numel(); begin += step)
      parts.push_back({t, flat.narrow(0, begin, std::min(step, g.numel() - begin))});
  }
  return parts;
}

// For parts of one dtype: [norms..., max-abs..., non-zero counts...], float64, stacked in one
// operator. The non-zero count is the L1 norm of the signs, made in groups of at most
// kGroupBytes (the signs are the one temporary).
at::Tensor foreach_columns(const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> columns = at::_foreach_norm(xs, 2, at::kDouble);
  const std::vector<at::Tensor> max_abs = at::_foreach_norm(xs, INFINITY, at::kDouble);
  columns.insert(columns.end(), max_abs.begin(), max_abs.end());
  std::vector<at::Tensor> group;
  int64_t group_bytes = 0;
  auto count_group = [&] {
    if (group.empty()) return;
    const std::vector<at::Tensor> nonzeros = at::_foreach_norm(at::_foreach_sign(group), 1, at::kDouble);
    columns.insert(columns.end(), nonzeros.begin(), nonzeros.end());
    group.clear();
    group_bytes = 0;
  };
  for (const at::Tensor& x : xs) {
    if (group_bytes + bytes_of(x) > kGroupBytes) count_group();
    group.push_back(x);
    group_bytes += bytes_of(x);
  }
  count_group();
  return at::stack(columns);
}

bool all_cpu_float(const std::vector<at::Tensor>& grads) {
  return std::all_of(grads.begin(), grads.end(), [](const at::Tensor& g) {
    return !g.defined() || (g.device().is_cpu() && g.scalar_type() == at::kFloat);
  });
}

at::Device device_of(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars) {
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) return g.device();
  return scalars.empty() ? at::Device(at::kCPU) : scalars.front().device();
}

// The scalars, packed and read once: the fused scan's only read.
void read_scalars(const std::vector<at::Tensor>& scalars, std::vector<double>& values) {
  values.clear();
  if (scalars.empty()) return;
  std::vector<at::Tensor> packed;
  for (const auto& s : scalars) packed.push_back(s.detach().to(at::kDouble).reshape({-1}));
  const at::Tensor host = read_to_host(at::cat(packed)).contiguous();
  values.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

// Per dtype, the parts' [norms..., max-abs..., non-zero counts...] (foreach_columns), in a fixed
// order; `elements` receives how many elements they hold.
struct ForeachColumns {
  std::vector<Part> parts;
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;  // part indices; a fixed order
  std::vector<at::Tensor> columns;                         // one tensor per dtype
  int64_t elements = 0;
};

ForeachColumns foreach_ops_columns(const std::vector<at::Tensor>& grads) {
  ForeachColumns c;
  c.parts = cut_into_parts(grads);
  for (size_t i = 0; i < c.parts.size(); ++i) {
    c.by_dtype[c.parts[i].data.scalar_type()].push_back(i);
    c.elements += c.parts[i].data.numel();
  }
  for (const auto& [dtype, indices] : c.by_dtype) {
    std::vector<at::Tensor> xs;
    for (size_t i : indices) xs.push_back(c.parts[i].data);
    c.columns.push_back(foreach_columns(xs));
  }
  return c;
}

// The statistics from the columns as read (`v`), per tensor and in total; returns where they end.
const double* decode_foreach_columns(const ForeachColumns& c, const double* v, GradStats& stats) {
  for (const auto& [dtype, indices] : c.by_dtype) {
    const size_t n = indices.size();
    for (size_t k = 0; k < n; ++k) {
      const Part& part = c.parts[indices[k]];
      const double squares = v[k] * v[k], max_abs = v[n + k], nonzero = v[2 * n + k];
      stats.tensor_sum_squares[part.tensor] += squares;
      stats.sum_squares += squares;
      stats.max_abs =
          std::isnan(max_abs) || std::isnan(stats.max_abs) ? std::nan("") : std::max(stats.max_abs, max_abs);
      stats.elements += part.data.numel();
      if (!std::isnan(max_abs)) stats.zeros += part.data.numel() - static_cast<int64_t>(nonzero);
    }
    v += 3 * n;
  }
  return v;
}

GradStats foreach_ops_stats(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                            std::vector<double>& values) {
  const ForeachColumns c = foreach_ops_columns(grads);
  const at::Device device = device_of(grads, scalars);
  std::vector<at::Tensor> packed = c.columns;
  int64_t scalar_count = 0;
  for (const auto& s : scalars) {
    packed.push_back(s.detach().to(device, at::kDouble).reshape({-1}));
    scalar_count += s.numel();
  }
  GradStats stats;
  stats.tensor_sum_squares.assign(grads.size(), 0.0);
  values.clear();
  if (packed.empty()) return stats;
  const at::Tensor host = read_to_host(at::cat(packed)).contiguous();  // the step's one read
  const double* v = decode_foreach_columns(c, host.data_ptr<double>(), stats);
  values.assign(v, v + scalar_count);
  return stats;
}

}  // namespace

const char* to_string(DeviceStatsRecipe recipe) {
  switch (recipe) {
    case DeviceStatsRecipe::automatic:
      return "automatic";
    case DeviceStatsRecipe::foreach_ops:
      return "foreach_ops";
    case DeviceStatsRecipe::fused_scan:
      return "fused_scan";
    case DeviceStatsRecipe::chunk_kernel:
      return "chunk_kernel";
  }
  return "?";
}

DeviceStatsRecipe parse_stats_recipe(const std::string& text) {
  std::string names;
  for (const DeviceStatsRecipe r : kStatsRecipes) {
    if (text == to_string(r)) return r;
    names += (names.empty() ? "" : ", ") + std::string(to_string(r));
  }
  throw Error(ErrorCategory::usage, "statistics recipe '" + text + "' is not one of " + names);
}

ResolvedStatsRecipe choose_stats_recipe(DeviceStatsRecipe requested, const StatsRecipeFacts& f) {
  // Every recipe measures one device's gradients: the chunk kernel's address table would hold
  // another device's pointers, the others' packed read would join tensors of several devices.
  if (f.cuda_devices + (f.cpu_tensors ? 1 : 0) > 1)
    throw Error(ErrorCategory::usage,
                std::string("gradient statistics (recipe '") + to_string(requested) +
                    "') measure the gradients of one device, and these parameters are on " +
                    std::to_string(f.cuda_devices) + " CUDA device" + (f.cuda_devices == 1 ? "" : "s") +
                    (f.cpu_tensors ? " and the CPU" : "") +
                    ": give each device's parameters an optimizer of their own");
  if (requested == DeviceStatsRecipe::chunk_kernel) {
    if (!f.kernel_dtypes)
      throw Error(ErrorCategory::usage,
                  "the chunk_kernel statistics recipe takes float, half and bfloat16 gradients only");
    if (f.cuda_devices > 0) require_chunk_kernel_in(f.kernel_built);
  }
  if (requested != DeviceStatsRecipe::automatic) return {requested, ""};
  if (f.all_cpu_float) return {DeviceStatsRecipe::fused_scan, ""};
  if (f.cuda_devices == 0) return {DeviceStatsRecipe::foreach_ops, ""};
  std::string why;
  if (!f.kernel_built)
    why = "this build has no statistics kernel (nvcc was not found when it was configured)";
  else if (!f.kernel_dtypes)
    why = "some parameters are neither float, half nor bfloat16";
  if (why.empty()) return {DeviceStatsRecipe::chunk_kernel, ""};
  return {DeviceStatsRecipe::foreach_ops, "gradient statistics: foreach_ops instead of chunk_kernel: " + why};
}

ResolvedStatsRecipe resolve_stats_recipe(DeviceStatsRecipe requested,
                                         const std::vector<at::Tensor>& parameters) {
  StatsRecipeFacts f;
  f.all_cpu_float = all_cpu_float(parameters);
  f.kernel_dtypes = chunk_kernel_dtypes(parameters);
  f.kernel_built = chunk_kernel_built();
  std::vector<at::Device> devices;
  for (const auto& p : parameters) {
    if (!p.defined()) continue;
    if (!p.is_cuda()) {
      f.cpu_tensors = true;
      continue;
    }
    if (std::find(devices.begin(), devices.end(), p.device()) == devices.end()) devices.push_back(p.device());
  }
  f.cuda_devices = static_cast<int>(devices.size());
  ResolvedStatsRecipe chosen = choose_stats_recipe(requested, f);
  if (!devices.empty()) fall_back_where_kernel_refused(requested, devices.front(), chosen);  // kernel_check.h
  return chosen;
}

GradStats compute_grad_stats_on_device(const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& scalars,
                                       std::vector<double>& scalar_values, DeviceStatsRecipe recipe) {
  return GradStatsPass(resolve_stats_recipe(recipe, grads).recipe).run(grads, scalars, scalar_values);
}

// The recipes that keep nothing between steps; GradStatsPass::run (gradient_table.cpp) calls them.
GradStats run_stateless_recipe(DeviceStatsRecipe recipe, const std::vector<at::Tensor>& grads,
                               const std::vector<at::Tensor>& scalars, std::vector<double>& scalar_values) {
  if (recipe == DeviceStatsRecipe::foreach_ops) return foreach_ops_stats(grads, scalars, scalar_values);
  GradStats stats = compute_grad_stats(grads);
  read_scalars(scalars, scalar_values);
  return stats;
}

at::Tensor stats_reduction_vector(const at::Tensor& sum_squares, const at::Tensor& max_abs,
                                  const at::Tensor& zeros, int64_t elements,
                                  const std::vector<at::Tensor>& scalars) {
  const at::Tensor count = at::full({}, static_cast<double>(elements), sum_squares.options());
  std::vector<at::Tensor> parts{at::stack({sum_squares, max_abs, zeros, count})};
  for (const auto& s : scalars)
    parts.push_back(s.detach().to(sum_squares.device(), at::kDouble).reshape({-1}));
  return at::cat(parts);
}

void take_reduced_totals(const double* reduced, int64_t count, GradStats& stats,
                         std::vector<double>& scalar_values) {
  stats.sum_squares = reduced[StatsReduction::kSumSquares];
  stats.max_abs = reduced[StatsReduction::kMaxAbs];
  stats.zeros = static_cast<int64_t>(reduced[StatsReduction::kZeros]);
  stats.elements = static_cast<int64_t>(reduced[StatsReduction::kElements]);
  scalar_values.assign(reduced + StatsReduction::kFields, reduced + count);
}

// The totals from the columns on the device (the zeros of a part that holds NaN counted as the
// non-zero count leaves them: only a skipped step's zero_fraction can differ from the host's).
GradStats foreach_ops_stats_reduced(const std::vector<at::Tensor>& grads,
                                    const std::vector<at::Tensor>& scalars,
                                    std::vector<double>& scalar_values, StatsReduction& reduction) {
  const ForeachColumns c = foreach_ops_columns(grads);
  const at::Device device = device_of(grads, scalars);
  const auto f64 = at::TensorOptions().device(device).dtype(at::kDouble);
  at::Tensor squares = at::zeros({}, f64), max_abs = at::zeros({}, f64), nonzero = at::zeros({}, f64);
  size_t k = 0;
  for (const auto& [dtype, indices] : c.by_dtype) {
    const int64_t n = static_cast<int64_t>(indices.size());
    const at::Tensor& col = c.columns[k++];
    squares = at::add(squares, col.narrow(0, 0, n).square().sum());
    max_abs = at::maximum(max_abs, col.narrow(0, n, n).amax());  // both propagate NaN
    nonzero = at::add(nonzero, col.narrow(0, 2 * n, n).sum());
  }
  const at::Tensor zeros = at::sub(at::full({}, static_cast<double>(c.elements), f64), nonzero);
  std::vector<at::Tensor> packed = c.columns;
  packed.push_back(reduction.reduce(stats_reduction_vector(squares, max_abs, zeros, c.elements, scalars)));
  const int64_t reduced_count = packed.back().numel();
  GradStats stats;
  stats.tensor_sum_squares.assign(grads.size(), 0.0);
  const at::Tensor host = read_to_host(at::cat(packed)).contiguous();  // the step's one read
  const double* v = decode_foreach_columns(c, host.data_ptr<double>(), stats);
  take_reduced_totals(v, reduced_count, stats, scalar_values);
  return stats;
}

}  // namespace ampkit
