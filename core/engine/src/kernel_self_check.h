// The first-use self-check's two halves (kernel_check_cases.cpp), for kernel_self_check.cpp.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace ampkit {

// The statistics kernel (on a CPU device: chunk_stats_on_host, its stand-in) over a crafted set of
// float, half and bfloat16 gradients against chunk_stats_on_host on host copies: max-abs, zero and
// NaN counts equal, sums of squares within n * DBL_EPSILON of each other (n: the chunk's elements;
// the order of the float64 additions differs). "" where they agree, else the chunk and the values.
// `wrong`: the kernel's first number is made wrong before the comparison (KernelFault::stats).
std::string check_stats_kernel(const at::Device& device, bool wrong);

// The rules kernel (on a CPU device: the scalar function it runs) over a fixed case table against
// ampkit_step_rules_run on the host, bit for bit: every output and the state. "" where they agree,
// else the case, the field and both values. `wrong`: one bit of the kernel's first clip coefficient
// is flipped before the comparison (KernelFault::rules).
std::string check_rules_kernel(const at::Device& device, bool wrong);

}  // namespace ampkit
