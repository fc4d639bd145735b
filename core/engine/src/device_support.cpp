// Device capability checks through the CUDA runtime already in the process (no CUDA headers).
#include "ampkit/device_support.h"

#include <ATen/cpu/Utils.h>
#include <dlfcn.h>

namespace ampkit {

std::optional<std::pair<int, int>> cuda_compute_capability(int index) {
  // LibTorch's CUDA libraries link the runtime; RTLD_NOLOAD finds it only if it is loaded.
  void* runtime = nullptr;
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"})
    if ((runtime = ::dlopen(name, RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
  if (runtime == nullptr) return std::nullopt;
  using GetAttribute = int (*)(int*, int, int);
  auto get = reinterpret_cast<GetAttribute>(::dlsym(runtime, "cudaDeviceGetAttribute"));
  if (get == nullptr) return std::nullopt;
  // cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76 (stable values of the runtime API).
  int major = 0, minor = 0;
  if (get(&major, 75, index) != 0 || get(&minor, 76, index) != 0) return std::nullopt;
  return std::make_pair(major, minor);
}

std::string cuda_precision_problem(Precision precision, std::pair<int, int> capability) {
  if (precision != Precision::bf16 || capability.first >= 8) return "";
  return "bf16 needs a GPU of compute capability 8.0 (Ampere) or newer; this one is " +
         std::to_string(capability.first) + "." + std::to_string(capability.second);
}

CpuCapabilities cpu_capabilities() {
  CpuCapabilities out;
  for (const auto& [key, value] : at::cpu::get_cpu_capabilities()) {
    if (value.isBool()) out.flags[key] = value.toBool();
    if (key == "cpu_name" && value.isString()) out.name = value.toStringRef();
  }
  return out;
}

std::string cpu_precision_note(Precision precision, const CpuCapabilities& cpu) {
  if (precision == Precision::fp32) return "";
  const auto has = [&cpu](const char* flag) {
    const auto it = cpu.flags.find(flag);
    return it != cpu.flags.end() && it->second;
  };
  // torch's own condition (mkldnn_bf16_device_check / mkldnn_fp16_device_check, whose error
  // reads "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq").
  const bool fast = has("avx_ne_convert") ||
                    (precision == Precision::bf16 ? has("avx512_bw") && has("avx512_vl") && has("avx512_dq")
                                                  : has("avx512_fp16") || has("amx_fp16"));
  if (fast) return "";
  const char* needs =
      precision == Precision::bf16 ? "AVX-512 or AVX-NE-CONVERT" : "AVX512-FP16 or AVX-NE-CONVERT";
  const std::string name = to_string(precision);
  return "note: this CPU" + (cpu.name.empty() ? std::string() : " (" + cpu.name + ")") + " has no " + needs +
         ", so LibTorch runs " + name +
         " matmuls without oneDNN, some over 100x slower than fp32: a step on CPU "
         "usually takes several times as long as in fp32 (docs/benchmarks.md)";
}

}  // namespace ampkit
