// Loads and launches the kernels of cuda/grad_stats_kernel.cu: the statistics kernel
// (grad_stats_chunks.h) and the deferred step's rules kernel (step_rules_kernel.h):
// its fatbin is embedded in this library at build time and loaded through the CUDA driver API
// (libcuda.so.1, which LibTorch's CUDA runtime has already loaded), once per device, into that
// device's primary context, where it checks first that the fatbin holds an image the device runs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <string>

#include "ampkit/error.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/kernel_check.h"
#include "kernel_module.h"
#include "step_rules_kernel.h"

#if AMPKIT_HAS_STATS_KERNEL
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/grad_stats_kernel_abi.h"

extern "C" const unsigned char ampkit_grad_stats_fatbin[];
#endif

namespace ampkit {

#if AMPKIT_HAS_STATS_KERNEL  // GCOVR_EXCL_START: only a CUDA device runs this (docs/development.md)

namespace {

using CUresult = int;                                        // CUDA_SUCCESS is 0
constexpr int kCapabilityMajor = 75, kCapabilityMinor = 76;  // CUdevice_attribute

struct Driver {
  CUresult (*init)(unsigned flags) = nullptr;
  CUresult (*device_get)(int* device, int ordinal) = nullptr;
  CUresult (*device_attribute)(int* value, int attribute, int device) = nullptr;
  CUresult (*primary_context_retain)(void** context, int device) = nullptr;
  CUresult (*context_push)(void* context) = nullptr;
  CUresult (*context_pop)(void** context) = nullptr;
  CUresult (*module_load_data)(void** module, const void* image) = nullptr;
  CUresult (*module_get_function)(void** function, void* module, const char* name) = nullptr;
  CUresult (*launch_kernel)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                            unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                            void* stream, void** params, void** extra) = nullptr;
  CUresult (*get_error_string)(CUresult result, const char** text) = nullptr;
  CUresult (*stream_is_capturing)(void* stream, int* status) = nullptr;
};

template <typename F>
void bind(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(::dlsym(library, name));
  if (function == nullptr)
    throw Error(ErrorCategory::internal, std::string("the CUDA driver has no ") + name + "()");
}

// The driver's entry points, by the names cuda.h maps its calls to (the _v2 ones where it does).
const Driver& driver() {
  static const Driver loaded = [] {
    void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr)
      throw Error(ErrorCategory::internal, std::string("cannot load the CUDA driver: ") + ::dlerror());
    Driver d;
    bind(library, "cuInit", d.init);
    bind(library, "cuDeviceGet", d.device_get);
    bind(library, "cuDeviceGetAttribute", d.device_attribute);
    bind(library, "cuDevicePrimaryCtxRetain", d.primary_context_retain);
    bind(library, "cuCtxPushCurrent_v2", d.context_push);
    bind(library, "cuCtxPopCurrent_v2", d.context_pop);
    bind(library, "cuModuleLoadData", d.module_load_data);
    bind(library, "cuModuleGetFunction", d.module_get_function);
    bind(library, "cuLaunchKernel", d.launch_kernel);
    bind(library, "cuGetErrorString", d.get_error_string);
    bind(library, "cuStreamIsCapturing", d.stream_is_capturing);
    return d;
  }();
  return loaded;
}

std::string error_text(CUresult result) {
  const char* text = nullptr;
  driver().get_error_string(result, &text);
  return text != nullptr ? text : "CUDA error " + std::to_string(result);
}

void check(CUresult result, const std::string& what) {
  if (result != 0)
    throw Error(ErrorCategory::internal, "the statistics kernel: " + what + " failed: " + error_text(result));
}

// The device's primary context (the one LibTorch's runtime uses) current for a scope, whatever the
// calling thread had current before (nothing, on a thread whose first CUDA call this is, or a
// context another library pushed): the module is loaded into it and its kernels launched there.
class ContextScope {
 public:
  explicit ContextScope(void* context) {
    check(driver().context_push(context), "making the device's context current");
  }
  ~ContextScope() {
    void* popped = nullptr;
    driver().context_pop(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
};

// The statistics kernels (float, half, bfloat16) and the rules kernel, loaded into the primary
// context of one device (retained for the process: the module is never unloaded), or why not.
using Kernels = std::array<void*, 4>;
constexpr size_t kRulesKernel = 3;
struct Module {
  void* context = nullptr;
  Kernels kernels{};
  std::string failure;
};

// Whether the fatbin holds an image for the device's capability (checked before the driver is asked,
// so the reason names both), then the module in the device's primary context.
Module load_module(int device) {
  Module m;
  int handle = 0, major = 0, minor = 0;
  check(driver().init(0), "initialising the CUDA driver");
  check(driver().device_get(&handle, device), "finding device " + std::to_string(device));
  check(driver().device_attribute(&major, kCapabilityMajor, handle), "reading the compute capability");
  check(driver().device_attribute(&minor, kCapabilityMinor, handle), "reading the compute capability");
  const std::vector<KernelImage> images =
      fatbin_images(ampkit_grad_stats_fatbin, fatbin_size(ampkit_grad_stats_fatbin, SIZE_MAX));
  const std::string capability = std::to_string(major) + "." + std::to_string(minor);
  // A fatbin whose header this code cannot read (a later nvcc's layout) is left to the driver.
  if (!images.empty() && !loadable_image(images, major, minor)) {
    m.failure = "its module holds no image for compute capability " + capability + " (it holds " +
                describe_images(images) + ")";
    return m;
  }
  check(driver().primary_context_retain(&m.context, handle), "retaining the device's primary context");
  const ContextScope scope(m.context);
  void* module = nullptr;
  const CUresult loaded = driver().module_load_data(&module, ampkit_grad_stats_fatbin);
  if (loaded != 0) {
    m.failure = "the CUDA driver cannot load its module on compute capability " + capability + ": " +
                error_text(loaded);
    return m;
  }
  const char* names[] = {"ampkit_grad_stats_float", "ampkit_grad_stats_half", "ampkit_grad_stats_bfloat16",
                         "ampkit_step_rules_kernel"};
  for (size_t i = 0; i < m.kernels.size(); ++i)
    check(driver().module_get_function(&m.kernels[i], module, names[i]), names[i]);
  return m;
}

const Module& module_on(int device) {
  static std::mutex mutex;
  static std::map<int, Module> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(device);
  if (found != loaded.end()) return found->second;
  Module m;
  try {
    m = load_module(device);
  } catch (const std::exception& e) {  // no driver, or a driver call failed: a reason, kept
    m.failure = e.what();
  }
  return loaded.emplace(device, std::move(m)).first->second;
}

// The module of `device`, loaded; its failure (kernel_module_failure's) as an internal error where a
// launch comes anyway (a caller that did not ask kernel_refusal first).
const Module& loaded_module(int device) {
  const Module& m = module_on(device);
  if (!m.failure.empty()) throw Error(ErrorCategory::internal, "the statistics kernel: " + m.failure);
  return m;
}

size_t kernel_index(at::ScalarType dtype) {
  return dtype == at::kFloat ? 0 : dtype == at::kHalf ? 1 : 2;
}

}  // namespace

bool chunk_kernel_built() {
  return true;
}

std::string kernel_module_failure(int device) {
  return module_on(device).failure;
}

bool current_stream_capturing(int device) {
  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream, while a blocking stream captures.
  constexpr CUresult kCaptureImplicit = 906;
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  try {
    if (driver().init(0) != 0) return false;  // no device: nothing captures (and torch is not asked)
    const CUresult result =
        driver().stream_is_capturing(c10::cuda::getCurrentCUDAStream(device).stream(), &status);
    return result == kCaptureImplicit || (result == 0 && status != 0);
  } catch (const std::exception&) {  // no driver: nothing captures
    return false;
  }
}

SyncDebugModeSuspended::SyncDebugModeSuspended()
    : saved_(static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode())) {
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
}

SyncDebugModeSuspended::~SyncDebugModeSuspended() {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(saved_));
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
  const Module& m = loaded_module(out.device().index());
  const Kernels& k = m.kernels;
  const ContextScope context(m.context);
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
  const Module& m = loaded_module(device.index());
  const Kernels& k = m.kernels;
  const ContextScope context(m.context);
  void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  void* args[] = {&rules, &pointers};
  check(driver().launch_kernel(k[kRulesKernel], 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr),
        "the rules' launch");
}

#else  // GCOVR_EXCL_STOP

bool chunk_kernel_built() {
  return false;
}

std::string kernel_module_failure(int) {
  return "this build has no kernels";
}

bool current_stream_capturing(int) {
  return false;
}

SyncDebugModeSuspended::SyncDebugModeSuspended() = default;
SyncDebugModeSuspended::~SyncDebugModeSuspended() = default;

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
