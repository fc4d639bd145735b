// The engine's own entry to the statistics recipes that keep nothing between steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ampkit/grad_stats.h"

namespace ampkit {

// foreach_ops or fused_scan (grad_stats.h) over `grads`, with `scalars` packed into their one read.
GradStats run_stateless_recipe(DeviceStatsRecipe recipe, const std::vector<at::Tensor>& grads,
                               const std::vector<at::Tensor>& scalars, std::vector<double>& scalar_values);

}  // namespace ampkit
