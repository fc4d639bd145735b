// The engine's own entry to the statistics recipes that keep nothing between steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ampkit/grad_stats.h"

namespace ampkit {

class StatsReduction;

// foreach_ops or fused_scan (grad_stats.h) over `grads`, with `scalars` packed into their one read.
GradStats run_stateless_recipe(DeviceStatsRecipe recipe, const std::vector<at::Tensor>& grads,
                               const std::vector<at::Tensor>& scalars, std::vector<double>& scalar_values);

// foreach_ops with this rank's totals reduced across ranks on the device (StatsReduction) before
// its one read: the totals and the scalars are the group's, the per-tensor norms this rank's.
GradStats foreach_ops_stats_reduced(const std::vector<at::Tensor>& grads,
                                    const std::vector<at::Tensor>& scalars,
                                    std::vector<double>& scalar_values, StatsReduction& reduction);

// This rank's totals as StatsReduction's vector: [sum of squares, max-abs, zeros, elements] (0-dim
// float64 tensors on one device), then the scalars' values, flattened.
at::Tensor stats_reduction_vector(const at::Tensor& sum_squares, const at::Tensor& max_abs,
                                  const at::Tensor& zeros, int64_t elements,
                                  const std::vector<at::Tensor>& scalars);
// The group's totals and scalars, read as `reduced` (StatsReduction's layout, `count` numbers), in
// place of this rank's in `stats` and `scalar_values`.
void take_reduced_totals(const double* reduced, int64_t count, GradStats& stats,
                         std::vector<double>& scalar_values);

}  // namespace ampkit
