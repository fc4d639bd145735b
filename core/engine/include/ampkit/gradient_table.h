// The gradients of one parameter list and their statistics pass, built once and kept between steps,
// so that the host work of a step does not grow with the number of parameters on a GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"

namespace ampkit {

// A statistics pass whose figures stay on the device (the deferred step, deferred_step.h): 0-dim
// float64 tensors, no host read.
struct DeviceTotals {
  at::Tensor sum_squares;     // of all scaled elements; inf or NaN where one is
  at::Tensor max_abs;         // the largest |element|; NaN where one is NaN
  at::Tensor zeros;           // elements exactly 0
  at::Tensor scalars;         // the scalars' values, flattened, in order
  int64_t elements = 0;       // this rank's
  at::Tensor group_elements;  // with a reduction (StatsReduction): the group's count, float64
  // Each gradient's sum of squares (per-tensor norms), as the synchronous pass sums them: already
  // on the host (fused_scan), or the chunks' sums on the device (chunk_kernel) with the plan's
  // chunk-to-gradient map, summed in plan order on the host once they are there (tensor_sums).
  std::vector<double> tensor_sum_squares;
  at::Tensor chunk_sum_squares;
  std::shared_ptr<const std::vector<size_t>> chunk_tensors;
  size_t tensors = 0;
};

// DeviceTotals' per-gradient sums of squares from `chunk_sums` (the chunks' sums, on the host),
// or its tensor_sum_squares where it has them.
std::vector<double> tensor_sums(const DeviceTotals& totals, const double* chunk_sums);

// Statistics reduced across the ranks a model's gradients are spread over (FSDP2's shards, or a
// loss averaged over data-parallel ranks), on the device, before the pass's one host read,
// so that every rank reads the same numbers and takes the same decision. The pass hands reduce()
// this rank's figures as one float64 vector on the gradients' device, in the order of Field, then
// the scalars' values; it returns the group's, in the same layout. The engine does not know the
// group: python/src/group_reduction.cpp makes one collective of it with c10d. The Trainer sets none
// (its gradients are averaged in its buckets, the loss with them).
class StatsReduction {
 public:
  enum Field : int64_t {
    kSumSquares,  // inf or NaN where an element is
    kMaxAbs,      // NaN where an element is NaN
    kZeros,
    kElements,
    kFields
  };
  virtual ~StatsReduction() = default;
  virtual at::Tensor reduce(const at::Tensor& local) = 0;
};

// One recipe's statistics pass (grad_stats.h), with what it keeps between steps: for chunk_kernel,
// the chunk plan and its copy on the device, made again only when a gradient moved, changed size
// or dtype (plan_matches), and the buffer the chunks' numbers and the scalars are packed into with
// the pinned host buffer they are read into, allocated once. A step whose gradients sit where
// they sat the step before (the caching allocator's usual case) runs the same small, fixed number
// of operators and allocations whatever the number of gradients.
class GradStatsPass {
 public:
  // `recipe`: resolved (resolve_stats_recipe), never automatic.
  explicit GradStatsPass(DeviceStatsRecipe recipe);

  DeviceStatsRecipe recipe() const { return recipe_; }

  // The statistics of `grads` and the values of `scalars` (as compute_grad_stats_on_device), one
  // host read.
  GradStats run(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                std::vector<double>& scalar_values);

  // The same pass with its figures left on the device, for chunk_kernel and fused_scan (on CPU
  // tensors, where there is nothing to read). The sum of squares is the one run() reads, to the bit;
  // with a reduction, the totals and scalars are the group's, as run() reads them (the collective
  // is queued on the device: no host read).
  // `tensor_sums`: also each gradient's sum of squares (DeviceTotals), for per-tensor norms.
  // `capturing`: the current stream is capturing a CUDA graph (DeferredStep::after_backward): a
  // chunk table made now is copied from a staging buffer made before the capture, and what the
  // graph reads or writes at its replays stays allocated for as long as this pass lives.
  DeviceTotals run_on_device(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                             bool tensor_sums = false, bool capturing = false);

  // How often the chunk plan was made (tests: once while the gradients stay where they are).
  int64_t plans_made() const { return plans_made_; }

  // With a reduction, run() reads the group's totals (sum of squares, max-abs, zeros, elements)
  // and scalars instead of this rank's, in the same one read; the per-tensor norms stay this rank's.
  void set_reduction(std::shared_ptr<StatsReduction> reduction) { reduction_ = std::move(reduction); }
  bool reduces() const { return reduction_ != nullptr; }

 private:
  GradStats run_reduced(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                        std::vector<double>& scalar_values);
  DeviceTotals local_totals(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                            bool tensor_sums, bool capturing);
  void reduce_totals(DeviceTotals& t) const;
  int64_t fill_chunk_buffer(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                            bool capturing = false);
  void upload_table(const at::Device& device, bool capturing);
  DeviceTotals chunk_totals(int64_t numbers) const;
  GradStats run_chunk_kernel(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                             std::vector<double>& scalar_values);

  DeviceStatsRecipe recipe_;
  StatsPlan plan_;
  at::Tensor table_;    // plan_'s chunk table on the device (CUDA only); undefined: to upload
  at::Tensor staging_;  // pinned, readied by every uncaptured step for the next upload in a capture
  std::vector<at::Tensor> graph_held_;  // what captured graphs copy from, read and write
  at::Tensor packed_;  // the chunks' four numbers, their sum of squares, the scalars: float64, on the device
  at::Tensor host_;    // where packed_ is read to: pinned host memory (packed_ itself on a CPU)
  std::shared_ptr<const std::vector<size_t>>
      chunk_tensors_;  // plan_'s chunks' gradients, shared with deferred records
  int64_t plans_made_ = 0;
  std::shared_ptr<StatsReduction> reduction_;
};

// The trainable parameters one optimizer steps, by name, with their statistics pass: the recipe
// is chosen when the table is built (resolve_stats_recipe, from the parameters' devices and
// dtypes and what the build has) and stored here. The Trainer holds one; ampkit.GradScaler one per
// optimizer, built on its first step and again only when its parameter list changes.
class GradientTable {
 public:
  GradientTable(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                DeviceStatsRecipe requested = DeviceStatsRecipe::automatic);

  DeviceStatsRecipe recipe() const { return pass_.recipe(); }
  // Why automatic did not take the chunk kernel for parameters on a GPU ("" when it did, or on a CPU).
  const std::string& recipe_fallback() const { return fallback_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& names() const { return names_; }

  // This step's gradients: every parameter's .grad(), undefined where it has none, in a vector
  // kept between steps (no allocation once it has its size).
  const std::vector<at::Tensor>& read_gradients();
  // The gradients as last read.
  const std::vector<at::Tensor>& gradients() const { return grads_; }
  // Measures `gradient` in place of parameter i's this step (a sparse gradient's values).
  void replace_gradient(size_t i, at::Tensor gradient) { grads_.at(i) = std::move(gradient); }

  // The statistics pass over gradients() and `scalars`: one host read.
  GradStats measure(const std::vector<at::Tensor>& scalars, std::vector<double>& scalar_values) {
    return pass_.run(grads_, scalars, scalar_values);
  }
  DeviceTotals measure_on_device(const std::vector<at::Tensor>& scalars, bool tensor_sums = false,
                                 bool capturing = false) {
    return pass_.run_on_device(grads_, scalars, tensor_sums, capturing);
  }
  int64_t plans_made() const { return pass_.plans_made(); }
  // Statistics reduced across ranks from now on (GradStatsPass::set_reduction); nullptr: none.
  void set_reduction(std::shared_ptr<StatsReduction> reduction) { pass_.set_reduction(std::move(reduction)); }
  bool reduces() const { return pass_.reduces(); }

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> grads_;
  std::string fallback_;
  GradStatsPass pass_;
};

}  // namespace ampkit
