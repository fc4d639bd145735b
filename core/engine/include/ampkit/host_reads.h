// Device-to-host reads of the training step, counted. On a GPU each read is a synchronisation
// that stalls the launch queue; the step's device path makes one per healthy step, and
// every read the engine makes goes through these functions so tests can hold that number.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ampkit {

// A blocking copy of `t` to the CPU (t itself when it is already there); counts one read.
at::Tensor read_to_host(const at::Tensor& t);
// A blocking copy of `t` into `host`, a CPU tensor of its size kept by the caller (pinned, for a
// GPU's `t`; `t` itself when it is on the CPU: nothing is copied); counts one read.
void read_into_host(at::Tensor& host, const at::Tensor& t);
// One element of `t` as a double; counts one read.
double read_scalar(const at::Tensor& t);
// Reads counted so far in this process (all threads).
int64_t host_reads();

}  // namespace ampkit
