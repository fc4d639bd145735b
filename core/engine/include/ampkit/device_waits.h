// Waits for a whole device, counted: a read that must see a CUDA graph's replays cannot wait on one
// stream (a graph replays on whatever stream is current), so it waits for the device, which stalls
// every stream of it. Tests count these waits as they count host reads (host_reads.h).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace ampkit {

// Waits for the work queued on every stream of `device`; counts one wait, on the CPU too (nothing
// to wait for there), so that tests see how often a GPU would wait. Inside a DeviceWaitScope on this
// thread, only the first call per device waits and counts.
void wait_for_device(const c10::Device& device);
// Waits counted so far in this process (all threads).
int64_t device_waits();

// While one lives on this thread, each device is waited for once: for a caller that reads several
// records kept on one device as of one moment (one wait, then every read).
class DeviceWaitScope {
 public:
  DeviceWaitScope();
  ~DeviceWaitScope();
  DeviceWaitScope(const DeviceWaitScope&) = delete;
  DeviceWaitScope& operator=(const DeviceWaitScope&) = delete;
};

}  // namespace ampkit
