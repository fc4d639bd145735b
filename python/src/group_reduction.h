// The statistics of sharded gradients (FSDP2) reduced across their process group with c10d.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "ampkit/gradient_table.h"

namespace ampkit::python {

// How the ranks' figures combine: `shards` (each rank holds a part of every gradient: squares, zeros
// and elements add up) or `replicas` (each rank holds whole gradients, equal under DDP: the largest
// of each is taken, so ranks whose gradients differ still decide alike). Either way the max-abs is
// the largest and the scalars (the loss) are averaged over the ranks.
enum class GradientLayout { shards, replicas };

// The process group registered in c10d under `group_name` (Python's ProcessGroup.group_name), as a
// StatsReduction: one all_gather of the small vector, then sums and maxima computed alike on every
// rank (rank order), so every rank gets the same bits. Throws Error(usage) naming the group when no
// such group is registered.
std::shared_ptr<StatsReduction> make_group_reduction(const std::string& group_name, GradientLayout layout);

}  // namespace ampkit::python
