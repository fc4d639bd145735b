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

}  // namespace ampkit
