// Persistent device buffers used from several streams, and reads of work queued on any stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "ampkit/device_waits.h"

namespace ampkit {

// Tells the caching allocator that `t`'s memory is used by its device's current stream. A buffer
// kept between steps is allocated on the stream of its first step (a warm-up on a side stream, as
// torch.cuda.graph's examples do it) and used on others later; without this, freeing it (a new size,
// the step dropped) would let its allocation stream take the memory back while another stream's
// queued work still reads or writes it. Nothing on the CPU; on the allocation stream the allocator
// ignores it.
inline void mark_used_on_current_stream(const at::Tensor& t) {
  if (!t.defined() || t.is_cpu()) return;
  const c10::impl::VirtualGuardImpl guard(t.device().type());
  guard.recordDataPtrOnStream(t.storage().data_ptr(), guard.getStream(t.device()));
}

// Waits for the work queued on every stream of `t`'s device (nothing on the CPU; counted there too:
// device_waits.h). A CUDA graph is replayed on whatever stream is current at the replay, with no host
// code of ours between replays to record an event there: a read that waits on one stream only could
// miss what a replay on another wrote.
inline void wait_for_every_stream(const at::Tensor& t) {
  if (t.defined()) wait_for_device(t.device());
}

}  // namespace ampkit
