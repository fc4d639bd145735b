// What the device can do for a precision, checked before training instead of failing mid-run.
#pragma once

#include <ampkit/step.h>

#include <map>
#include <optional>
#include <string>

namespace ampkit {

// Compute capability (major, minor) of CUDA device `index`, read through the CUDA runtime that
// LibTorch already loaded; nullopt when there is none (CPU-only build or no GPU).
std::optional<std::pair<int, int>> cuda_compute_capability(int index);

// Empty when `precision` runs natively on a CUDA device of this capability, otherwise the
// reason (bf16 needs compute capability 8.0, Ampere, or newer — torch.cuda.is_bf16_supported).
std::string cuda_precision_problem(Precision precision, std::pair<int, int> capability);

// The CPU's instruction-set extensions as LibTorch's cpuinfo reads them (at::cpu::
// get_cpu_capabilities: "avx512_bw" -> true, "amx_fp16" -> false, ...) and its name.
struct CpuCapabilities {
  std::map<std::string, bool> flags;
  std::string name;
};
CpuCapabilities cpu_capabilities();

// Empty when `precision` has fast matmuls on this CPU, otherwise a note for the user. LibTorch
// hands bf16 matmuls to oneDNN only on CPUs with AVX-NE-CONVERT or AVX-512 (avx512_bw, _vl, _dq)
// and fp16 matmuls only with AVX-NE-CONVERT or AVX512-FP16; elsewhere it runs its own
// reduced-precision GEMM, over 100x slower than fp32 for a Linear layer's input gradient
// (docs/benchmarks.md). fp32 is never noted.
std::string cpu_precision_note(Precision precision, const CpuCapabilities& cpu);

}  // namespace ampkit
