// The device statistics pass as one CUDA kernel: one read of every gradient element
// for its sum of squares, max-abs, zero count and NaN count, whatever the number of tensors.
// Plain CUDA C, no ATen: built by nvcc into a fatbin that grad_stats_kernel.cpp embeds and loads
// with the driver API. The host cuts the gradients into chunks of at most 65,536 elements (one
// block each) and copies the chunk table to the device; one launch per dtype covers all of its
// chunks. Each block writes its chunk's four numbers as float64 to out[4 * block].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "grad_stats_kernel_abi.h"

namespace {

template <typename T>
__device__ float to_float(T v);
template <>
__device__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ void chunk_stats(const ampkit_stats_chunk* chunks, double* out) {
  const ampkit_stats_chunk chunk = chunks[blockIdx.x];
  const T* x = reinterpret_cast<const T*>(chunk.address);
  // Squares accumulate in float64: a finite gradient above 1.8e19 (its square leaves float's
  // range) must not read as an overflow, and the host path accumulates in double too.
  double squares = 0.0;
  float max_abs = 0.0f;  // fmaxf skips NaN: NaNs are counted apart
  unsigned int zeros = 0, nans = 0;
  for (long long i = threadIdx.x; i < chunk.elements; i += AMPKIT_STATS_THREADS) {
    const float v = to_float<T>(x[i]);
    squares += static_cast<double>(v) * static_cast<double>(v);
    max_abs = fmaxf(max_abs, fabsf(v));
    zeros += v == 0.0f;
    nans += v != v;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    squares += __shfl_down_sync(0xffffffffu, squares, offset);
    max_abs = fmaxf(max_abs, __shfl_down_sync(0xffffffffu, max_abs, offset));
    zeros += __shfl_down_sync(0xffffffffu, zeros, offset);
    nans += __shfl_down_sync(0xffffffffu, nans, offset);
  }
  constexpr int kWarps = AMPKIT_STATS_THREADS / 32;
  __shared__ double warp_squares[kWarps];
  __shared__ float warp_max[kWarps];
  __shared__ unsigned int warp_zeros[kWarps], warp_nans[kWarps];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_squares[warp] = squares;
    warp_max[warp] = max_abs;
    warp_zeros[warp] = zeros;
    warp_nans[warp] = nans;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kWarps; ++w) {  // in warp order: the result does not depend on timing
    squares += warp_squares[w];
    max_abs = fmaxf(max_abs, warp_max[w]);
    zeros += warp_zeros[w];
    nans += warp_nans[w];
  }
  out += 4 * static_cast<long long>(blockIdx.x);
  out[0] = squares;
  out[1] = max_abs;
  out[2] = zeros;
  out[3] = nans;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(AMPKIT_STATS_THREADS)
    ampkit_grad_stats_float(const ampkit_stats_chunk* chunks, double* out) {
  chunk_stats<float>(chunks, out);
}
extern "C" __global__ void __launch_bounds__(AMPKIT_STATS_THREADS)
    ampkit_grad_stats_half(const ampkit_stats_chunk* chunks, double* out) {
  chunk_stats<__half>(chunks, out);
}
extern "C" __global__ void __launch_bounds__(AMPKIT_STATS_THREADS)
    ampkit_grad_stats_bfloat16(const ampkit_stats_chunk* chunks, double* out) {
  chunk_stats<__nv_bfloat16>(chunks, out);
}

/* The step's device rules (step_rules_abi.h): one thread runs what the host runs for CPU tensors. */
#include "step_rules_abi.h"

extern "C" __global__ void ampkit_step_rules_kernel(ampkit_step_rules rules, ampkit_step_pointers pointers) {
  ampkit_step_rules_run(&rules, &pointers);
}
