// Whether ampkit's own CUDA kernels (cuda/grad_stats_kernel.cu: the chunk_kernel statistics recipe
// and the deferred step's rules kernel) may run on a device: their module must hold an image the
// device loads, the driver must load it, and on first use per device the kernels must agree with
// the host forms the CPU tests prove (the self-check). Where they may not, the statistics fall back
// to the foreach recipe and the step stays synchronous, with one reason naming the kernel and the
// values. On CPU tensors the same decision runs over the kernels' CPU stand-ins, so that tests can
// plant a failure (KernelFault) and watch the fallback without a GPU.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ampkit/grad_stats.h"

namespace ampkit {

// One image of a fatbin: machine code for sm_<arch>, or PTX for compute_<arch> (arch 75 = 7.5).
struct KernelImage {
  int arch = 0;
  bool ptx = false;
  bool operator==(const KernelImage& o) const { return arch == o.arch && ptx == o.ptx; }
};

// The images a fatbin holds, in file order, read from its header and each entry's header with every
// offset bounds-checked against `size`; empty where `data` is not a fatbin.
std::vector<KernelImage> fatbin_images(const unsigned char* data, size_t size);
// The fatbin's whole size as its header states it (0 where `data` does not start with one).
size_t fatbin_size(const unsigned char* data, size_t available);

// The image the CUDA driver would load on a device of compute capability major.minor: machine code
// of the same major version and a minor version at most the device's (the newest such), else PTX
// of a capability at most the device's (the newest, compiled by the driver); nullopt where none.
std::optional<KernelImage> loadable_image(const std::vector<KernelImage>& images, int major, int minor);
// "sm_75, sm_80, PTX compute_75": the images, for messages.
std::string describe_images(const std::vector<KernelImage>& images);

// A planted failure of the kernels, for tests: their module fails to load, or a kernel's first
// result is wrong (the statistics kernel's or the rules kernel's). The environment variable
// AMPKIT_TEST_KERNEL_FAULT (load | stats | rules) plants one in a process that does not set it here.
enum class KernelFault { none, load, stats, rules };
// Plants `fault` for the devices checked from now on and forgets every verdict already made.
void set_kernel_fault(KernelFault fault);

// The verdict on a device's kernels: "" where they may run, else why not (which kernel, which
// values). Made once per device on first use (loading the module, then the self-check unless the
// environment variable AMPKIT_GPU_SELF_CHECK is 0) and kept for the process. A CUDA device in a
// build without the kernels has nothing to check (""): the foreach recipe and the synchronous step run.
std::string kernel_refusal(const at::Device& device);

// The verdict all ranks of a job share, from each rank's own (kernel_refusal, in rank order): ""
// where none refused the kernels, else the first refusing rank's reason, naming that rank, which is
// then kept as `device`'s verdict in this process in place of its own. One rank on the kernels and
// another on the foreach recipe and the synchronous step would sum their squares in another order:
// their clip coefficients, and then their parameters, would drift apart in the last bits.
std::string agree_kernel_refusal(const at::Device& device, const std::vector<std::string>& ranks);

// How many self-checks ran in this process, and the seconds they took together (docs/gpu.md).
struct KernelCheckCost {
  int checks = 0;
  double seconds = 0.0;
};
KernelCheckCost kernel_check_cost();

// A resolved statistics recipe that runs the chunk kernel on `device`, changed where the device's
// kernels are refused: automatic falls back to foreach_ops with the reason as `fallback`; the
// chunk_kernel recipe asked for by name is an Error(usage) naming the reason.
void fall_back_where_kernel_refused(DeviceStatsRecipe requested, const at::Device& device,
                                    ResolvedStatsRecipe& resolved);

}  // namespace ampkit
