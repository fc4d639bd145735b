// The kernels' module as the driver loads it (grad_stats_kernel.cpp), for the decision whether they
// may run on a device (kernel_check.h).
#pragma once

#include <string>

namespace ampkit {

// "" where the module of cuda/grad_stats_kernel.cu is loaded into CUDA device `device`'s primary
// context (done on the first call per device, kept for the process), else why not: no image for the
// device's compute capability (naming it and the images there are), or the driver's error.
std::string kernel_module_failure(int device);

// Whether CUDA device `device`'s current stream is capturing a CUDA graph (false in a build without
// the kernels): the first-use check's copies and reads would invalidate the capture there.
bool current_stream_capturing(int device);

// While one lives, c10's CUDA sync debug mode (torch.cuda.set_sync_debug_mode) is off; the mode is
// restored however the scope ends. The first-use check's copies and reads are ampkit's own, once per
// process, not the user's step: under "error" they would raise, and that was kept as the device's
// refusal for good. The mode is process-wide, so another thread's syncs pass unnoticed meanwhile.
// Nothing in a build without the kernels.
class SyncDebugModeSuspended {
 public:
  SyncDebugModeSuspended();
  ~SyncDebugModeSuspended();
  SyncDebugModeSuspended(const SyncDebugModeSuspended&) = delete;
  SyncDebugModeSuspended& operator=(const SyncDebugModeSuspended&) = delete;

 private:
  int saved_ = 0;  // c10::cuda::SyncDebugMode, as an int: this header keeps out CUDA's headers
};

}  // namespace ampkit
