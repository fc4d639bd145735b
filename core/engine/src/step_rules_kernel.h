// The deferred step's rules kernel (cuda/step_rules_abi.h, launched by grad_stats_kernel.cpp):
// where the build holds it, one launch runs a step's decisions on a GPU.
#pragma once

#include <c10/core/Device.h>

#include "cuda/step_rules_abi.h"

namespace ampkit {

// Whether this library holds the kernel (built where nvcc and LibTorch's CUDA libraries were found).
bool step_rules_kernel_built();

// One thread of ampkit_step_rules_run on `device`'s current stream; every pointer on that device.
void launch_step_rules(ampkit_step_rules rules, ampkit_step_pointers pointers, const at::Device& device);

}  // namespace ampkit
