// The engine's two passes over gradient bytes: one read pass for statistics, one multiply.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ampkit {

struct GradStats {
  double sum_squares = 0;  // over all elements; inf/NaN when any element is inf/NaN
  double max_abs = 0;
  int64_t zeros = 0;
  int64_t elements = 0;
  std::vector<double> tensor_sum_squares;  // one per gradient, same order
  bool finite() const;
};

// One read pass over every gradient (undefined gradients count as empty). fp32 CPU gradients
// use a fused loop (sum of squares accumulated in double, within 3.6e-7 relative worst case,
// exact to double where squares leave float's normal range; max-abs, zero count), AVX2 where
// the CPU has it; other dtypes and devices fall back to ATen reductions. Deterministic: the
// result does not depend on the thread count.
GradStats compute_grad_stats(const std::vector<at::Tensor>& grads);

// The device path of the same pass, for gradients on a GPU (and, for tests, on the CPU): tensor
// ops on the gradients' device (_foreach_norm in float64 for the per-tensor sums of squares and
// max-abs, count_nonzero for the zeros) packed with `scalars` (e.g. the step's loss) into one
// float64 tensor, read to the host once (read_to_host). `scalar_values` receives the scalars.
// Sums of squares are float64 reductions: within 1e-6 relative of the CPU fast path's.
GradStats compute_grad_stats_on_device(const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& scalars,
                                       std::vector<double>& scalar_values);

// grads *= factor, in place: one read-write pass; a factor of exactly 1 touches nothing.
void scale_grads_(const std::vector<at::Tensor>& grads, double factor);

}  // namespace ampkit
