// The chunk_kernel recipe of the device statistics pass (grad_stats.h): its host side, which
// runs and is tested everywhere. The gradients are cut into chunks of at most 65,536 elements,
// one launch per dtype; one kernel block per chunk computes four numbers (sum of squares,
// max-abs, zeros, NaNs) and the host combines them per tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ampkit/grad_stats.h"

namespace ampkit {

struct StatsChunk {
  size_t tensor;        // index into the gradients
  const void* address;  // the chunk's first element
  int64_t elements;
};

struct StatsLaunch {  // one per dtype present
  at::ScalarType dtype;
  size_t first;  // chunks [first, first + count)
  size_t count;
};

struct StatsPlan {
  std::vector<StatsChunk> chunks;
  std::vector<StatsLaunch> launches;
  std::vector<at::Tensor> data;  // the gradients' dense data, alive until the kernels ran
  // What the plan was made from, one entry per gradient (null and 0 where undefined or empty):
  // a later step whose gradients sit at the same addresses with the same sizes and dtypes has the
  // same chunks (plan_matches).
  std::vector<const void*> addresses;
  std::vector<int64_t> sizes;
  std::vector<at::ScalarType> dtypes;
};

// True when every defined gradient is float, half or bfloat16 (the kernel's dtypes).
bool chunk_kernel_dtypes(const std::vector<at::Tensor>& grads);

// The chunks and launches for `grads` (undefined and empty ones have none), in gradient order
// within each dtype; dtypes in a fixed order (float, half, bfloat16).
StatsPlan plan_stats_chunks(const std::vector<at::Tensor>& grads);

// Whether `plan` (made for earlier gradients) holds exactly the chunks plan_stats_chunks would make
// for `grads`: every gradient dense (channels_last too), at the address, with the size and dtype
// the plan recorded. Reads no tensor data and allocates nothing.
bool plan_matches(const StatsPlan& plan, const std::vector<at::Tensor>& grads);

// What one kernel block computes for `chunk`, on the host: the CPU side of the recipe, run on
// CPU tensors (tests) exactly as the kernel's arithmetic runs (float values, float64 squares).
void chunk_stats_on_host(const StatsChunk& chunk, at::ScalarType dtype, double out[4]);

// Every chunk's four numbers (partials[4 * chunk + k], in plan order) combined into the
// statistics: per tensor and overall. A tensor with a NaN has a NaN max-abs and counts no zeros
// (as the foreach recipe).
GradStats combine_chunk_stats(const StatsPlan& plan, const std::vector<at::Tensor>& grads,
                              const double* partials);

}  // namespace ampkit

namespace ampkit {

// Whether this library holds the CUDA kernel (built where nvcc and LibTorch's CUDA libraries
// were found; README.md, the build section).
bool chunk_kernel_built();
// Throws Error(usage), saying why, where this library does not hold the kernel (`built` false).
void require_chunk_kernel_in(bool built);

// `plan`'s chunk table (address and size of every chunk) on `device`, copied there once from
// pinned memory on the current stream: a GradientTable keeps it while its plan holds. The pinned
// memory is a new buffer of the host allocator's, or `staging` where given (pinned, int64, two
// numbers per chunk; in a CUDA graph capture the copy runs again at every replay, from there).
at::Tensor upload_chunk_table(const StatsPlan& plan, const at::Device& device,
                              const at::Tensor* staging = nullptr);

// Runs `plan`'s launches on the current stream of `out`'s CUDA device, each chunk's four numbers
// into out (float64, at least 4 x chunks elements, contiguous); `table` is upload_chunk_table's
// for this plan. Throws Error(internal) with the driver's message where a launch fails,
// Error(usage) where the kernel was not built.
void launch_chunk_kernel(const StatsPlan& plan, const at::Tensor& table, at::Tensor& out);

}  // namespace ampkit
