// Precision: autocast regions (on, off inside one, nested) and what the engine says about a device
// that cannot run a precision well (bf16 on a pre-Ampere GPU, bf16/fp16 on a CPU without fast
// matmuls).
#define BOOST_TEST_MODULE precision
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <initializer_list>
#include <string>

#include "ampkit/autocast_guard.h"
#include "ampkit/device_support.h"

using namespace ampkit;

BOOST_AUTO_TEST_CASE(autocast_guard_lowers_matmul_precision_only_inside) {
  const at::Tensor x = at::randn({4, 4}), y = at::randn({4, 4});
  {
    AutocastGuard guard(Precision::bf16, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kBFloat16);
  }
  {
    AutocastGuard guard(Precision::fp16, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kHalf);
  }
  {
    AutocastGuard guard(Precision::fp32, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
  }
  BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
}

BOOST_AUTO_TEST_CASE(autocast_off_guard_restores_fp32_inside_an_autocast_region) {
  const at::Tensor x = at::randn({64, 64}), y = at::randn({64, 64});
  const at::Tensor exact = at::mm(x, y);
  {
    AutocastGuard on(Precision::bf16, at::kCPU);
    {
      AutocastOffGuard off(at::kCPU);
      const at::Tensor inside = at::mm(x, y);
      BOOST_TEST(inside.scalar_type() == at::kFloat);
      BOOST_TEST(at::equal(inside, exact));  // the same kernel as without any guard
      {
        AutocastGuard nested(Precision::fp16, at::kCPU);  // a region may turn it back on
        BOOST_TEST(at::mm(x, y).scalar_type() == at::kHalf);
      }
      BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
    }
    const at::Tensor after = at::mm(x, y);
    BOOST_TEST(after.scalar_type() == at::kBFloat16);  // the outer region is back
    BOOST_TEST(!at::equal(after.to(at::kFloat), exact));
  }
  {
    AutocastOffGuard off(at::kCPU);  // with autocast already off: changes nothing
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
  }
  BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
}

BOOST_AUTO_TEST_CASE(bf16_on_cuda_needs_ampere) {
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {8, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {9, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::fp16, {7, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {7, 5}) ==
             "bf16 needs a GPU of compute capability 8.0 (Ampere) or newer; this one is 7.5");
}

BOOST_AUTO_TEST_CASE(reduced_precision_on_a_cpu_without_fast_matmuls_is_noted) {
  const auto cpu = [](std::initializer_list<const char*> flags) {
    CpuCapabilities c;
    c.name = "Test CPU";
    for (const char* f :
         {"avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16", "avx_ne_convert"})
      c.flags[f] = false;
    for (const char* f : flags) c.flags[f] = true;
    return c;
  };
  const CpuCapabilities avx2 = cpu({"avx2"}), avx512 = cpu({"avx2", "avx512_bw", "avx512_vl", "avx512_dq"}),
                        sapphire =
                            cpu({"avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16"}),
                        ne_convert = cpu({"avx2", "avx_ne_convert"}),
                        half_avx512 = cpu({"avx2", "avx512_bw", "avx512_vl"});
  BOOST_TEST(
      cpu_precision_note(Precision::bf16, avx2) ==
      "note: this CPU (Test CPU) has no AVX-512 or AVX-NE-CONVERT, so LibTorch runs bf16 matmuls without "
      "oneDNN, some over 100x slower than fp32: a step on CPU usually takes several times as long as in "
      "fp32 (docs/benchmarks.md)");
  BOOST_TEST(cpu_precision_note(Precision::fp16, avx2)
                 .find("has no AVX512-FP16 or AVX-NE-CONVERT, so LibTorch runs fp16 matmuls") !=
             std::string::npos);
  BOOST_TEST(!cpu_precision_note(Precision::bf16, half_avx512).empty());  // oneDNN needs all three
  BOOST_TEST(cpu_precision_note(Precision::bf16, avx512).empty());
  BOOST_TEST(!cpu_precision_note(Precision::fp16, avx512).empty());
  BOOST_TEST(cpu_precision_note(Precision::fp16, sapphire).empty());
  BOOST_TEST(cpu_precision_note(Precision::bf16, ne_convert).empty());
  BOOST_TEST(cpu_precision_note(Precision::fp16, ne_convert).empty());
  for (const auto& c : {avx2, avx512, CpuCapabilities{}})
    BOOST_TEST(cpu_precision_note(Precision::fp32, c).empty());
  // LibTorch reports this machine's flags under the names the decision reads.
  const CpuCapabilities here = cpu_capabilities();
  for (const char* f : {"avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16", "avx_ne_convert"})
    BOOST_TEST(here.flags.count(f) == 1u, f);
}
