// The host side of the chunk_kernel statistics recipe (grad_stats_chunks.h).
#include "ampkit/grad_stats_chunks.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/grad_stats_kernel_abi.h"

namespace ampkit {

namespace {

constexpr at::ScalarType kDtypes[] = {at::kFloat, at::kHalf, at::kBFloat16};

template <typename T>
void scan(const T* x, int64_t n, double out[4]) {
  double squares = 0.0;
  float max_abs = 0.0f;
  int64_t zeros = 0, nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    squares += static_cast<double>(v) * static_cast<double>(v);
    max_abs = std::fmax(max_abs, std::fabs(v));
    zeros += v == 0.0f;
    nans += std::isnan(v);
  }
  out[0] = squares;
  out[1] = max_abs;
  out[2] = static_cast<double>(zeros);
  out[3] = static_cast<double>(nans);
}

// Whether `g`'s elements fill one block of memory, without gaps or overlaps, from data_ptr() (its
// lowest address: strides are never negative) for numel() elements. The statistics do not depend
// on the elements' order, so such a gradient (channels_last, a transpose) is read where it lies,
// in memory order, and planned once like a contiguous one; only the others are copied.
bool dense(const at::Tensor& g) {
  return g.is_non_overlapping_and_dense();
}

}  // namespace

bool chunk_kernel_dtypes(const std::vector<at::Tensor>& grads) {
  return std::all_of(grads.begin(), grads.end(), [](const at::Tensor& g) {
    return !g.defined() ||
           std::find(std::begin(kDtypes), std::end(kDtypes), g.scalar_type()) != std::end(kDtypes);
  });
}

StatsPlan plan_stats_chunks(const std::vector<at::Tensor>& grads) {
  StatsPlan plan;
  plan.addresses.assign(grads.size(), nullptr);
  plan.sizes.assign(grads.size(), 0);
  plan.dtypes.assign(grads.size(), at::ScalarType::Undefined);
  for (const at::ScalarType dtype : kDtypes) {
    const size_t launch_first = plan.chunks.size();
    for (size_t t = 0; t < grads.size(); ++t) {
      const at::Tensor& g = grads[t];
      if (!g.defined() || g.numel() == 0 || g.scalar_type() != dtype) continue;
      plan.addresses[t] = dense(g) ? g.data_ptr() : nullptr;  // a copy: made again each step
      plan.sizes[t] = g.numel();
      plan.dtypes[t] = dtype;
      const at::Tensor data = dense(g) ? g : g.contiguous();
      plan.data.push_back(data);
      const auto* base = static_cast<const char*>(data.data_ptr());
      for (int64_t begin = 0; begin < data.numel(); begin += AMPKIT_STATS_CHUNK_ELEMENTS)
        plan.chunks.push_back({t, base + begin * static_cast<int64_t>(data.element_size()),
                               std::min<int64_t>(AMPKIT_STATS_CHUNK_ELEMENTS, data.numel() - begin)});
    }
    if (plan.chunks.size() > launch_first)
      plan.launches.push_back({dtype, launch_first, plan.chunks.size() - launch_first});
  }
  return plan;
}

bool plan_matches(const StatsPlan& plan, const std::vector<at::Tensor>& grads) {
  if (plan.addresses.size() != grads.size()) return false;
  for (size_t t = 0; t < grads.size(); ++t) {
    const at::Tensor& g = grads[t];
    if (!g.defined() || g.numel() == 0) {
      if (plan.sizes[t] != 0) return false;
      continue;
    }
    // A gradient the plan copied (not dense) has no stable address: plan again.
    if (plan.addresses[t] == nullptr || !dense(g) || g.data_ptr() != plan.addresses[t] ||
        g.numel() != plan.sizes[t] || g.scalar_type() != plan.dtypes[t])
      return false;
  }
  return true;
}

void chunk_stats_on_host(const StatsChunk& chunk, at::ScalarType dtype, double out[4]) {
  switch (dtype) {
    case at::kFloat:
      return scan(static_cast<const float*>(chunk.address), chunk.elements, out);
    case at::kHalf:
      return scan(static_cast<const c10::Half*>(chunk.address), chunk.elements, out);
    default:
      return scan(static_cast<const c10::BFloat16*>(chunk.address), chunk.elements, out);
  }
}

GradStats combine_chunk_stats(const StatsPlan& plan, const std::vector<at::Tensor>& grads,
                              const double* partials) {
  GradStats stats;
  stats.tensor_sum_squares.assign(grads.size(), 0.0);
  std::vector<double> max_abs(grads.size(), 0.0), zeros(grads.size(), 0.0), nans(grads.size(), 0.0);
  for (size_t c = 0; c < plan.chunks.size(); ++c) {  // plan order: deterministic sums
    const size_t t = plan.chunks[c].tensor;
    const double* p = partials + 4 * c;
    stats.tensor_sum_squares[t] += p[0];
    max_abs[t] = std::max(max_abs[t], p[1]);
    zeros[t] += p[2];
    nans[t] += p[3];
  }
  for (size_t t = 0; t < grads.size(); ++t) {
    if (!grads[t].defined()) continue;
    stats.sum_squares += stats.tensor_sum_squares[t];
    stats.elements += grads[t].numel();
    if (nans[t] > 0) {
      stats.max_abs = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (!std::isnan(stats.max_abs)) stats.max_abs = std::max(stats.max_abs, max_abs[t]);
    stats.zeros += static_cast<int64_t>(zeros[t]);
  }
  return stats;
}

}  // namespace ampkit
