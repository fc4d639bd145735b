// The torchscript workload's data: tensors python saved with torch.save({"inputs": X, "targets": Y}).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace ampkit::train {

// Cross entropy's default ignore_index, as torch's: a class-index target that takes no part.
constexpr int64_t kIgnoredClass = -100;

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

// Error(data) naming `option` when `loss` cannot take the targets' dtype: cross_entropy takes class
// indices (an integer dtype) or probabilities (a float dtype), mse a float dtype.
void check_target_dtype(const TensorData& data, const std::string& loss, const std::string& option);

// Error(data) naming `option`, the sample and the value of the first class-index target that is not
// one of the model's `classes` (cross entropy's ignore_index, -100, is allowed). Float targets pass.
void check_class_range(const TensorData& data, int64_t classes, const std::string& option);

}  // namespace ampkit::train
