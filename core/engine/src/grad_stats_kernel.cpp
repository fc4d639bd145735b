// Loads and launches the kernels of cuda/grad_stats_kernel.cu: the statistics kernel
// (grad_stats_chunks.h) and the deferred step's rules kernel (step_rules_kernel.h):
// its fatbin is embedded in this library at build time and loaded through the CUDA driver API
// (libcuda.so.1, which LibTorch's CUDA runtime has already loaded), once per device.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <string>

#include "ampkit/error.h"
#include "ampkit/grad_stats_chunks.h"
#include "step_rules_kernel.h"

#if AMPKIT_HAS_STATS_KERNEL
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#include <array>
#include <map>
#include <mutex>

#include "cuda/grad_stats_kernel_abi.h"

extern "C" const unsigned char ampkit_grad_stats_fatbin[];
#endif

namespace ampkit {

#if AMPKIT_HAS_STATS_KERNEL

namespace {

using CUresult = int;  // CUDA_SUCCESS is 0

struct Driver {
  CUresult (*module_load_data)(void** module, const void* image) = nullptr;
  CUresult (*module_get_function)(void** function, void* module, const char* name) = nullptr;
  CUresult (*launch_kernel)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                            unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                            void* stream, void** params, void** extra) = nullptr;
  CUresult (*get_error_string)(CUresult result, const char** text) = nullptr;
};

template <typename F>
void bind(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(::dlsym(library, name));
  if (function == nullptr)
    throw Error(ErrorCategory::internal, std::string("the CUDA driver has no ") + name + "()");
}

const Driver& driver() {
  static const Driver loaded = [] {
    void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr)
      throw Error(ErrorCategory::internal, std::string("cannot load the CUDA driver: ") + ::dlerror());
    Driver d;
    bind(library, "cuModuleLoadData", d.module_load_data);
    bind(library, "cuModuleGetFunction", d.module_get_function);
    bind(library, "cuLaunchKernel", d.launch_kernel);
    bind(library, "cuGetErrorString", d.get_error_string);
    return d;
  }();
  return loaded;
}

void check(CUresult result, const std::string& what) {
  if (result == 0) return;
  const char* text = nullptr;
  driver().get_error_string(result, &text);
  throw Error(ErrorCategory::internal, "the statistics kernel: " + what + " failed: " +
                                           (text != nullptr ? text : "CUDA error " + std::to_string(result)));
}

// The statistics kernels (float, half, bfloat16) and the rules kernel in the current context of
// `device`.
using Kernels = std::array<void*, 4>;
constexpr size_t kRulesKernel = 3;

const Kernels& kernels_on(int device) {
  static std::mutex mutex;
  static std::map<int, Kernels> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(device);
  if (found != loaded.end()) return found->second;
  void* module = nullptr;
  check(driver().module_load_data(&module, ampkit_grad_stats_fatbin), "loading its module");
  Kernels k{};
  const char* names[] = {"ampkit_grad_stats_float", "ampkit_grad_stats_half", "ampkit_grad_stats_bfloat16",
                         "ampkit_step_rules_kernel"};
  for (size_t i = 0; i < k.size(); ++i)
    check(driver().module_get_function(&k[i], module, names[i]), names[i]);
  return loaded.emplace(device, k).first->second;
}

// The current device switched for a scope. (c10's CUDAGuard would bring the CUDA runtime's
// symbols into this file; the engine links only LibTorch's libraries.)
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex device) : previous_(c10::cuda::ExchangeDevice(device)) {}
  ~DeviceScope() { c10::cuda::ExchangeDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

size_t kernel_index(at::ScalarType dtype) {
  return dtype == at::kFloat ? 0 : dtype == at::kHalf ? 1 : 2;
}

}  // namespace

bool chunk_kernel_built() {
  return true;
}

at::Tensor upload_chunk_table(const StatsPlan& plan, const at::Device& device, const at::Tensor* staging) {
  // Copied on the stream from pinned memory; the host allocator keeps the buffer until the copy
  // has run (a staging buffer, its owner).
  static_assert(sizeof(ampkit_stats_chunk) == 2 * sizeof(int64_t), "a chunk is two 64-bit numbers");
  const auto size = static_cast<int64_t>(2 * plan.chunks.size());
  if (staging && (staging->numel() != size || staging->scalar_type() != at::kLong))
    throw Error(ErrorCategory::internal, "upload_chunk_table: the staging buffer does not fit the plan");
  at::Tensor table =
      staging ? *staging : at::empty({size}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* entries = reinterpret_cast<ampkit_stats_chunk*>(table.data_ptr<int64_t>());
  for (size_t c = 0; c < plan.chunks.size(); ++c)
    entries[c] = {reinterpret_cast<unsigned long long>(plan.chunks[c].address),
                  static_cast<long long>(plan.chunks[c].elements)};
  return table.to(device, /*non_blocking=*/true);
}

void launch_chunk_kernel(const StatsPlan& plan, const at::Tensor& table, at::Tensor& out) {
  if (plan.chunks.empty()) return;
  const DeviceScope scope(out.device().index());
  const Kernels& k = kernels_on(out.device().index());
  void* stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();
  for (const StatsLaunch& launch : plan.launches) {
    const auto* chunks =
        reinterpret_cast<const ampkit_stats_chunk*>(table.data_ptr<int64_t>()) + launch.first;
    double* partials = out.data_ptr<double>() + 4 * launch.first;
    void* args[] = {&chunks, &partials};
    check(driver().launch_kernel(k[kernel_index(launch.dtype)], static_cast<unsigned>(launch.count), 1, 1,
                                 AMPKIT_STATS_THREADS, 1, 1, 0, stream, args, nullptr),
          "a launch");
  }
}

bool step_rules_kernel_built() {
  return true;
}

void launch_step_rules(ampkit_step_rules rules, ampkit_step_pointers pointers, const at::Device& device) {
  const DeviceScope scope(device.index());
  const Kernels& k = kernels_on(device.index());
  void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  void* args[] = {&rules, &pointers};
  check(driver().launch_kernel(k[kRulesKernel], 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr),
        "the rules' launch");
}

#else

bool chunk_kernel_built() {
  return false;
}

bool step_rules_kernel_built() {
  return false;
}

void launch_step_rules(ampkit_step_rules, ampkit_step_pointers, const at::Device&) {
  throw Error(ErrorCategory::internal, "this build has no rules kernel");
}

at::Tensor upload_chunk_table(const StatsPlan&, const at::Device&, const at::Tensor*) {
  require_chunk_kernel_in(false);
  return {};
}

void launch_chunk_kernel(const StatsPlan&, const at::Tensor&, at::Tensor&) {
  require_chunk_kernel_in(false);
}

#endif

void require_chunk_kernel_in(bool built) {
  if (!built)
    throw Error(ErrorCategory::usage,
                "the chunk_kernel statistics recipe needs CUDA: this build has no statistics kernel (nvcc or "
                "LibTorch's CUDA libraries were not found when it was configured)");
}

}  // namespace ampkit
