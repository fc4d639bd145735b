// Data-parallel settings, apart from the Trainer so that a configuration can hold them without
// including the whole step pipeline.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace ampkit {

// Data-parallel settings (torch DDP's, with its defaults); see Trainer::enable_data_parallel.
struct DataParallelOptions {
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool broadcast_buffers = true;
  std::vector<at::Tensor> buffers;  // the model's buffers, sent from rank 0 before each step
};

}  // namespace ampkit
