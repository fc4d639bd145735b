// Counted device-to-host reads, and counted waits for a whole device.
#include "ampkit/host_reads.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "ampkit/device_waits.h"

namespace ampkit {

namespace {
std::atomic<int64_t> g_reads{0};
std::atomic<int64_t> g_waits{0};
thread_local int t_wait_scopes = 0;
thread_local std::vector<c10::Device> t_waited;  // in the open DeviceWaitScope
}  // namespace

at::Tensor read_to_host(const at::Tensor& t) {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  return t.device().is_cpu() ? t : t.to(at::kCPU);
}

void read_into_host(at::Tensor& host, const at::Tensor& t) {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  if (!host.is_same(t)) host.copy_(t);  // blocking: the copy has landed when it returns
}

double read_scalar(const at::Tensor& t) {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  return t.item<double>();
}

int64_t host_reads() {
  return g_reads.load(std::memory_order_relaxed);
}

void wait_for_device(const c10::Device& device) {
  if (t_wait_scopes > 0) {
    if (std::find(t_waited.begin(), t_waited.end(), device) != t_waited.end()) return;
    t_waited.push_back(device);
  }
  g_waits.fetch_add(1, std::memory_order_relaxed);
  if (device.is_cpu()) return;
  c10::impl::VirtualGuardImpl(device.type()).synchronizeDevice(device.index());
}

int64_t device_waits() {
  return g_waits.load(std::memory_order_relaxed);
}

DeviceWaitScope::DeviceWaitScope() {
  ++t_wait_scopes;
}

DeviceWaitScope::~DeviceWaitScope() {
  if (--t_wait_scopes == 0) t_waited.clear();
}

}  // namespace ampkit
