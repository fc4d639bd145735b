// What the device can do for a precision, checked before training instead of failing mid-run.
#pragma once

#include <ampkit/step.h>

#include <optional>
#include <string>

namespace ampkit {

// Compute capability (major, minor) of CUDA device `index`, read through the CUDA runtime that
// LibTorch already loaded; nullopt when there is none (CPU-only build or no GPU).
std::optional<std::pair<int, int>> cuda_compute_capability(int index);

// Empty when `precision` runs natively on a CUDA device of this capability, otherwise the
// reason (bf16 needs compute capability 8.0, Ampere, or newer — torch.cuda.is_bf16_supported).
std::string cuda_precision_problem(Precision precision, std::pair<int, int> capability);

}  // namespace ampkit
