// Host-to-device copies of batches, as PyTorch's DataLoader(pin_memory=True) + .to(non_blocking=True).
#include <ATen/ops/empty.h>

#include "workloads/workload.h"

namespace ampkit::train {

at::Tensor to_device(const at::Tensor& batch, const at::Device& device) {
  if (!device.is_cuda() || !batch.device().is_cpu()) return batch.to(device);
  // Pinned (page-locked) memory lets the copy run asynchronously on the current stream; the
  // caching host allocator keeps the pinned block alive until that copy has finished, so the
  // temporary may go out of scope at once (c10/cuda/CachingHostAllocator).
  return batch.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace ampkit::train
