// Autocast for a scope (torch.autocast's __enter__/__exit__ in C++).
#include "ampkit/autocast_guard.h"

#include <ATen/autocast_mode.h>

namespace ampkit {

AutocastGuard::AutocastGuard(Precision precision, c10::DeviceType device) : device_(device) {
  const std::optional<c10::ScalarType> dtype = autocast_dtype(precision);
  if (!dtype) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Casts of weights are cached while autocast is on; drop them when the outermost scope ends,
  // as torch.autocast's __exit__ does, so the cache never holds stale weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

AutocastOffGuard::AutocastOffGuard(c10::DeviceType device) : device_(device) {
  previous_enabled_ = at::autocast::is_autocast_enabled(device);
  at::autocast::set_autocast_enabled(device, false);
  at::autocast::increment_nesting();
}

AutocastOffGuard::~AutocastOffGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
}

}  // namespace ampkit
