// Device capability checks through the CUDA runtime already in the process (no CUDA headers).
#include "ampkit/device_support.h"

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
  return "--precision bf16 needs a GPU of compute capability 8.0 (Ampere) or newer; this one is " +
         std::to_string(capability.first) + "." + std::to_string(capability.second) +
         ": use --precision fp16 with --scaler dynamic";
}

}  // namespace ampkit
