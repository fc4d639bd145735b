// Fused gradient statistics (sum of squares, max-abs, zeros) in one read pass, and the scaling.
#include "ampkit/grad_stats.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ampkit/host_reads.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampkit {

namespace {

struct Partial {
  double sum_squares = 0;
  float max_abs = 0;
  int64_t zeros = 0;
  void merge(const Partial& o) {
    sum_squares += o.sum_squares;
    max_abs = std::max(max_abs, o.max_abs);
    zeros += o.zeros;
  }
};

// Four independent double accumulators keep the loop throughput-bound rather than
// latency-bound; doubles keep the norm exact enough for 1e-6 parity on 1e8 elements and make
// overflow of the sum impossible for finite float inputs.
Partial scan_floats_scalar(const float* p, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  float m0 = 0, m1 = 0;
  int64_t z = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float a = p[i], b = p[i + 1], c = p[i + 2], d = p[i + 3];
    s0 += static_cast<double>(a) * a;
    s1 += static_cast<double>(b) * b;
    s2 += static_cast<double>(c) * c;
    s3 += static_cast<double>(d) * d;
    m0 = std::max(m0, std::max(std::fabs(a), std::fabs(b)));
    m1 = std::max(m1, std::max(std::fabs(c), std::fabs(d)));
    z += (a == 0.0f) + (b == 0.0f) + (c == 0.0f) + (d == 0.0f);
  }
  for (; i < n; ++i) {
    s0 += static_cast<double>(p[i]) * p[i];
    m0 = std::max(m0, std::fabs(p[i]));
    z += p[i] == 0.0f;
  }
  Partial out;
  out.sum_squares = (s0 + s1) + (s2 + s3);
  out.max_abs = std::max(m0, m1);
  out.zeros = z;
  return out;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AMPKIT_GRAD_STATS_AVX2 1
// The same pass with AVX2, squares widened to double: each 8 floats become two 4-double vectors
// that are squared and added with FMA into double accumulators (the scalar loop's accuracy, one
// rounding fewer). Exact for every input; limited by float->double conversions (one port).
__attribute__((target("avx2,fma"))) Partial scan_floats_avx2_wide(const float* p, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(),
          s3 = _mm256_setzero_pd();
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  int64_t zeros = 0;
  int64_t i = 0;
  while (n - i >= 16) {
    // Zero counts gather in int32 lanes (+1 per lane per 16 floats), emptied every 2^26 rounds.
    const int64_t stop = i + std::min<int64_t>((n - i) / 16, int64_t(1) << 26) * 16;
    __m256i z0 = _mm256_setzero_si256(), z1 = _mm256_setzero_si256();
    for (; i < stop; i += 16) {
      const __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(p + i + 8);
      const __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                    a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
      const __m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(b)),
                    b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
      s0 = _mm256_fmadd_pd(a0, a0, s0);
      s1 = _mm256_fmadd_pd(a1, a1, s1);
      s2 = _mm256_fmadd_pd(b0, b0, s2);
      s3 = _mm256_fmadd_pd(b1, b1, s3);
      // max_ps returns its second operand when either is NaN: the running max stays a number,
      // as std::max does in the scalar loop (a NaN shows in the sum of squares instead).
      m0 = _mm256_max_ps(_mm256_and_ps(a, abs_mask), m0);
      m1 = _mm256_max_ps(_mm256_and_ps(b, abs_mask), m1);
      // A true compare is all ones, -1 as an integer: subtracting it counts the zero.
      z0 = _mm256_sub_epi32(z0, _mm256_castps_si256(_mm256_cmp_ps(a, zero, _CMP_EQ_OQ)));
      z1 = _mm256_sub_epi32(z1, _mm256_castps_si256(_mm256_cmp_ps(b, zero, _CMP_EQ_OQ)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi32(z0, z1));
    for (int32_t lane : lanes) zeros += lane;
  }
  alignas(32) double sums[4];
  _mm256_store_pd(sums, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  alignas(32) float maxima[8];
  _mm256_store_ps(maxima, _mm256_max_ps(m0, m1));
  Partial out = scan_floats_scalar(p + i, n - i);  // the last < 16 elements
  out.sum_squares += (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (float m : maxima) out.max_abs = std::max(out.max_abs, m);
  out.zeros += zeros;
  return out;
}

// The fast pass: squares summed in float over short blocks (16 squares per lane: four FMA
// chains of 4, then a tree of 2 adds), each block sum added to double accumulators. A block sum
// carries at most 6 roundings, so the sum of squares is within 6 * 2^-24 = 3.6e-7 relative (the
// norm within 1.8e-7), worst case, however many elements; blocks add in double. It is only
// valid while the squares stay normal floats that cannot overflow a block: the caller checks the
// max-abs this pass returns and redoes the chunk with the wide pass otherwise.
__attribute__((target("avx2,fma"))) Partial scan_floats_avx2_blocked(const float* p, int64_t n) {
  __m256d d0 = _mm256_setzero_pd(), d1 = _mm256_setzero_pd();
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  constexpr int64_t kBlock = 128;  // 4 rounds of 32 floats
  int64_t zeros = 0;
  int64_t i = 0;
  while (n - i >= kBlock) {
    // Zero counts gather in int32 lanes (+16 at most per lane per block), emptied every 2^22 blocks.
    const int64_t stop = i + std::min<int64_t>((n - i) / kBlock, int64_t(1) << 22) * kBlock;
    __m256i z = _mm256_setzero_si256();
    for (; i < stop; i += kBlock) {
      __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps(), f2 = _mm256_setzero_ps(),
             f3 = _mm256_setzero_ps();
      for (int64_t r = 0; r < kBlock; r += 32) {
        const float* q = p + i + r;
        const __m256 a = _mm256_loadu_ps(q), b = _mm256_loadu_ps(q + 8);
        const __m256 c = _mm256_loadu_ps(q + 16), d = _mm256_loadu_ps(q + 24);
        f0 = _mm256_fmadd_ps(a, a, f0);
        f1 = _mm256_fmadd_ps(b, b, f1);
        f2 = _mm256_fmadd_ps(c, c, f2);
        f3 = _mm256_fmadd_ps(d, d, f3);
        m0 = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(a, abs_mask), _mm256_and_ps(c, abs_mask)), m0);
        m1 = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(b, abs_mask), _mm256_and_ps(d, abs_mask)), m1);
        const __m256i zab = _mm256_add_epi32(_mm256_castps_si256(_mm256_cmp_ps(a, zero, _CMP_EQ_OQ)),
                                             _mm256_castps_si256(_mm256_cmp_ps(b, zero, _CMP_EQ_OQ)));
        const __m256i zcd = _mm256_add_epi32(_mm256_castps_si256(_mm256_cmp_ps(c, zero, _CMP_EQ_OQ)),
                                             _mm256_castps_si256(_mm256_cmp_ps(d, zero, _CMP_EQ_OQ)));
        z = _mm256_sub_epi32(z, _mm256_add_epi32(zab, zcd));
      }
      const __m256 f = _mm256_add_ps(_mm256_add_ps(f0, f1), _mm256_add_ps(f2, f3));
      d0 = _mm256_add_pd(d0, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
      d1 = _mm256_add_pd(d1, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), z);
    for (int32_t lane : lanes) zeros += lane;
  }
  alignas(32) double sums[4];
  _mm256_store_pd(sums, _mm256_add_pd(d0, d1));
  alignas(32) float maxima[8];
  _mm256_store_ps(maxima, _mm256_max_ps(m0, m1));
  Partial out = scan_floats_scalar(p + i, n - i);  // the last < 128 elements, in double
  out.sum_squares += (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (float m : maxima) out.max_abs = std::max(out.max_abs, m);
  out.zeros += zeros;
  return out;
}
#endif

Partial scan_floats(const float* p, int64_t n) {
#ifdef AMPKIT_GRAD_STATS_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) {
    // Blocks are exact enough while every square is a normal float and 16 of them cannot
    // overflow: max-abs in [2^-40, 2^62] (below it, squares of the smaller elements would lose
    // bits as subnormals; all zeros are exact). Otherwise, and for inf/NaN, redo the chunk wide
    // (it is still in cache); ordinary scaled or unscaled gradients never need to.
    const Partial fast = scan_floats_avx2_blocked(p, n);
    const bool in_range = fast.max_abs == 0.0f || (fast.max_abs >= 0x1p-40f && fast.max_abs <= 0x1p62f);
    if (in_range && std::isfinite(fast.sum_squares)) return fast;
    return scan_floats_avx2_wide(p, n);
  }
#endif
  return scan_floats_scalar(p, n);
}

// fp32 CPU gradients are cut into fixed chunks; all chunks of all tensors go through one
// parallel region (one thread hand-off per step, however many tensors), and each tensor's
// chunks are summed in chunk order: the result does not depend on the thread count or on which
// thread finished first, so runs stay bit-reproducible.
constexpr int64_t kChunk = 1 << 16;

struct Chunk {
  size_t tensor;
  const float* data;
  int64_t size;
};

bool scanned_as_cpu_float(const at::Tensor& g) {
  return g.defined() && g.numel() > 0 && g.device().is_cpu() && g.scalar_type() == at::kFloat;
}

Partial scan_generic(const at::Tensor& g) {
  const at::Tensor f = g.to(at::kFloat);
  Partial out;
  out.sum_squares = read_scalar(at::pow(f.to(at::kDouble), 2).sum());
  out.max_abs = static_cast<float>(read_scalar(at::abs(f).max()));
  out.zeros = static_cast<int64_t>(read_scalar(at::eq(f, 0).sum()));
  return out;
}

}  // namespace

bool GradStats::finite() const {
  return std::isfinite(sum_squares) && !std::isnan(max_abs);
}

GradStats compute_grad_stats(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> contiguous(grads.size());
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < grads.size(); ++t) {
    if (!scanned_as_cpu_float(grads[t])) continue;
    contiguous[t] = grads[t].is_contiguous() ? grads[t] : grads[t].contiguous();
    const float* data = contiguous[t].data_ptr<float>();
    const int64_t n = contiguous[t].numel();
    for (int64_t begin = 0; begin < n; begin += kChunk)
      chunks.push_back({t, data + begin, std::min(kChunk, n - begin)});
  }
  std::vector<Partial> parts(chunks.size());
  const auto scan = [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const Chunk& c = chunks[static_cast<size_t>(k)];
      parts[static_cast<size_t>(k)] = scan_floats(c.data, c.size);
    }
  };
  if (chunks.size() > 1)
    at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, scan);
  else
    scan(0, static_cast<int64_t>(chunks.size()));

  GradStats stats;
  stats.tensor_sum_squares.reserve(grads.size());
  size_t next_chunk = 0;
  for (size_t t = 0; t < grads.size(); ++t) {
    const at::Tensor& g = grads[t];
    if (!g.defined() || g.numel() == 0) {
      stats.tensor_sum_squares.push_back(0.0);
      continue;
    }
    Partial p;
    if (scanned_as_cpu_float(g)) {
      for (; next_chunk < chunks.size() && chunks[next_chunk].tensor == t; ++next_chunk)
        p.merge(parts[next_chunk]);
    } else {
      p = scan_generic(g);
    }
    stats.tensor_sum_squares.push_back(p.sum_squares);
    stats.sum_squares += p.sum_squares;
    stats.max_abs = std::max(stats.max_abs, static_cast<double>(p.max_abs));
    stats.zeros += p.zeros;
    stats.elements += g.numel();
  }
  return stats;
}

void scale_grads_(const std::vector<at::Tensor>& grads, double factor) {
  if (factor == 1.0) return;
  // torch's unscale multiplies in the gradients' opmath type (float32 for bf16, fp16 and fp32,
  // float64 for fp64) by a factor of that type. A Scalar gets that on CUDA; on the CPU it reaches
  // bf16 and fp16 tensors rounded to their own type (1 ulp off in about 12% of bf16 elements at a
  // scale of 1000), so there a 0-dim tensor of the opmath type carries it.
  std::vector<at::Tensor> device, cpu_float, cpu_double;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    if (!g.is_cpu())
      device.push_back(g);
    else if (g.scalar_type() == at::kDouble)
      cpu_double.push_back(g);
    else
      cpu_float.push_back(g);
  }
  if (!device.empty()) at::_foreach_mul_(device, at::Scalar(factor));
  if (!cpu_float.empty())
    at::_foreach_mul_(cpu_float, at::scalar_tensor(factor, at::TensorOptions().dtype(at::kFloat)));
  if (!cpu_double.empty())
    at::_foreach_mul_(cpu_double, at::scalar_tensor(factor, at::TensorOptions().dtype(at::kDouble)));
}

}  // namespace ampkit
