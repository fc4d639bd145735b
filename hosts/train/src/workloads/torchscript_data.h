// The torchscript workload's data: tensors python saved with torch.save({"inputs": X, "targets": Y}).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace ampkit::train {

struct TensorData {
  at::Tensor inputs, targets;  // CPU, the same length along dimension 0
  int64_t size() const { return inputs.size(0); }
};

// Reads `path`: one such file, or a folder of *.pt shards concatenated in name order. Read as
// torch.load(weights_only=True) reads (no pickled code runs). Error(data) naming `option` and the
// file for anything else: not a dict with tensors "inputs" and "targets", lengths that differ,
// shards whose shapes or dtypes differ, an empty folder, a *.pt entry that is not a regular file
// (a dangling symlink, a FIFO, a device).
TensorData read_tensor_data(const std::string& path, const std::string& option);

}  // namespace ampkit::train
