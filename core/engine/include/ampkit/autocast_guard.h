// Autocast for a scope, as `with torch.autocast(device, dtype):` does it.
#pragma once

#include <ampkit/step.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace ampkit {

// The dtype autocast runs a precision's forward in: none for fp32.
inline std::optional<c10::ScalarType> autocast_dtype(Precision precision) {
  if (precision == Precision::fp32) return std::nullopt;
  return precision == Precision::bf16 ? c10::kBFloat16 : c10::kHalf;
}

// Enables autocast for a precision on a device type for the guard's lifetime (nothing for fp32);
// restores the previous state and, when the outermost guard ends, clears the cast cache.
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, c10::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_;
};

// Turns autocast off on a device type for the guard's lifetime, as
// `with torch.autocast(device, enabled=False):` does: ops inside run in their inputs' dtypes
// (cast them to fp32 yourself where they came from an autocast region). For computations that
// must not depend on --precision: labels, metrics, a numerically sensitive block of a model.
class AutocastOffGuard {
 public:
  explicit AutocastOffGuard(c10::DeviceType device);
  ~AutocastOffGuard();
  AutocastOffGuard(const AutocastOffGuard&) = delete;
  AutocastOffGuard& operator=(const AutocastOffGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_ = false;
};

}  // namespace ampkit
