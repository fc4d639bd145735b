// The engine's two passes over gradient bytes: one read pass for statistics, one multiply.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
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
// `scalar_values` receives the scalars' elements, flattened, in order. Three recipes compute them:
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
//
// automatic picks fused_scan when every gradient is an fp32 CPU tensor; chunk_kernel when they
// are all on one CUDA device, float, half or bfloat16, and this build holds the kernel;
// foreach_ops otherwise (resolve_stats_recipe). The recipe is chosen once, when a GradientTable is built
// (gradient_table.h), and stored there; there is no process-wide switch.
enum class DeviceStatsRecipe { automatic, foreach_ops, fused_scan, chunk_kernel };

// Every recipe, in the order messages list them, and their names ("automatic", "foreach_ops", ...).
inline constexpr DeviceStatsRecipe kStatsRecipes[] = {
    DeviceStatsRecipe::automatic, DeviceStatsRecipe::fused_scan, DeviceStatsRecipe::foreach_ops,
    DeviceStatsRecipe::chunk_kernel};
const char* to_string(DeviceStatsRecipe recipe);
// The recipe named `text`; throws Error(usage) naming the recipes otherwise.
DeviceStatsRecipe parse_stats_recipe(const std::string& text);

// The recipe that runs for gradients shaped as `parameters` (their devices and dtypes) and what
// this build has, with why automatic did not take the chunk kernel on a GPU ("" when it did, or
// when the parameters are on the CPU). A recipe other than automatic is checked and kept:
// chunk_kernel for other dtypes, or for CUDA tensors in a build without the kernel, is an
// Error(usage).
struct ResolvedStatsRecipe {
  DeviceStatsRecipe recipe = DeviceStatsRecipe::fused_scan;
  std::string fallback;
};
ResolvedStatsRecipe resolve_stats_recipe(DeviceStatsRecipe requested,
                                         const std::vector<at::Tensor>& parameters);

// The facts resolve_stats_recipe reads from the parameters and the build, and the choice made
// from them alone (a unit test covers every case without a GPU).
struct StatsRecipeFacts {
  bool all_cpu_float = false;  // every parameter an fp32 CPU tensor
  int cuda_devices = 0;        // how many CUDA devices hold parameters
  bool cpu_tensors = false;    // some parameter is not on a CUDA device
  bool kernel_dtypes = false;  // every parameter float, half or bfloat16
  bool kernel_built = false;   // chunk_kernel_built()
};
ResolvedStatsRecipe choose_stats_recipe(DeviceStatsRecipe requested, const StatsRecipeFacts& facts);

// One statistics pass with `recipe` (automatic: resolved from `grads` as above), packed with
// `scalars` into one host read. A GradientTable does the same with its tables kept between steps.
GradStats compute_grad_stats_on_device(const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& scalars,
                                       std::vector<double>& scalar_values,
                                       DeviceStatsRecipe recipe = DeviceStatsRecipe::automatic);

// grads *= factor, in place: one read-write pass; a factor of exactly 1 touches nothing. The factor
// is multiplied in the gradients' opmath type (rounded to float32 but for fp64), as torch's unscale.
void scale_grads_(const std::vector<at::Tensor>& grads, double factor);

}  // namespace ampkit
