// Counted device-to-host reads.
#include "ampkit/host_reads.h"

#include <atomic>

namespace ampkit {

namespace {
std::atomic<int64_t> g_reads{0};
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

}  // namespace ampkit
