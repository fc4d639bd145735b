// The engine's two passes over gradient bytes: one read pass for statistics, one multiply.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ampkit {

struct GradStats {
  double sum_squares = 0;  // over all elements; inf/NaN when any element is inf/NaN
  double max_abs = 0;      // NaN where an element is NaN (device path)
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

// The device path of the same pass, for gradients on a GPU (and, for tests, on the CPU): the
// statistics and `scalars` (small tensors of any shape, e.g. the step's loss, or every rank's
// loss and values) packed into one float64 tensor, read to the host once (read_to_host);
// `scalar_values` receives the scalars' elements, flattened, in order. Two recipes compute them:
//
// * foreach_ops, what a GPU runs: multi-tensor (_foreach) kernels whose number does not grow
//   with the number of gradients. Per dtype: _foreach_norm(2) accumulated in float64 (sums of
//   squares, within 1e-6 relative of the fast path's), _foreach_norm(inf) (max-abs, exact),
//   and the non-zero count as the L1 norm of _foreach_sign, made over groups of at most 64 MiB
//   (the only temporary). Gradients above 64 MiB are cut into contiguous views of at most 64
//   MiB, so the number of kernels grows with bytes, never with the tensor count. A gradient
//   part that holds NaN counts no zeros (sign(NaN) is 0): on such a non-finite step
//   zero_fraction undercounts, the fast path counts exactly.
// * fused_scan, for CPU tensors: compute_grad_stats's fused scan, then the same packing and one
//   read (a CPU has no launches to save).
// * chunk_kernel: one read of every element in ampkit's own CUDA kernel
//   (core/engine/src/cuda/grad_stats_kernel.cu) for float, half and bfloat16 gradients: chunks
//   of at most 65,536 elements, one block each, their table copied to the device once and one
//   launch per dtype present, so the launches never grow with the tensor count; each block writes
//   four float64 numbers (sum of squares accumulated in float64, max-abs, zeros, NaNs) into one
//   buffer, read with the scalars. On CPU tensors the same chunks are computed on the host (how
//   the tests check the recipe's logic); on CUDA tensors it needs a build that found nvcc.
//   It has not yet run on a GPU: automatic does not pick it until tools/gpu-check.sh has.
//
// automatic picks fused_scan when every gradient is a CPU tensor, foreach_ops otherwise.
enum class DeviceStatsRecipe { automatic, foreach_ops, fused_scan, chunk_kernel };

GradStats compute_grad_stats_on_device(const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& scalars,
                                       std::vector<double>& scalar_values,
                                       DeviceStatsRecipe recipe = DeviceStatsRecipe::automatic);

// The recipe the Trainer's device path uses (default automatic); tests and benchmarks force
// foreach_ops on CPU tensors to run what a GPU runs. Process-wide.
void set_device_stats_recipe(DeviceStatsRecipe recipe);
DeviceStatsRecipe device_stats_recipe();

// grads *= factor, in place: one read-write pass; a factor of exactly 1 touches nothing.
void scale_grads_(const std::vector<at::Tensor>& grads, double factor);

}  // namespace ampkit
