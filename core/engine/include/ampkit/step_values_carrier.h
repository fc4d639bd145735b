// The step's small values (every rank's loss and the caller's values) carried to every rank in
// the Reducer's own gradient buckets, so a data-parallel step runs no collective besides them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ampkit {

// A parameter that belongs to no model: zeros of [world, 1 + kMaxValues, 4] fp32, handed to the
// Reducer with the model's. Each step, attach() adds a term to the scaled loss whose value is
// exactly 0 and whose gradient with respect to this rank's row of the carrier is the rank's
// values, each float64 cut into four 16-bit pieces held as floats (integers 0-65535, exact in
// fp32). The other ranks' rows get zeros, so the Reducer's all-reduce (sum of the gradients,
// each multiplied by 1 / world) leaves every rank's pieces, divided by the world size, in one
// place: a gather without a collective of its own. The division costs less than 2^-23 of each
// piece, so world x piece rounds back to the exact integer and every value, NaN and infinity
// included, arrives bit for bit. The model's gradients are untouched: the term adds 0 to the
// loss and reaches only the carrier.
class StepValuesCarrier {
 public:
  static constexpr int64_t kMaxValues = 8;  // per rank, besides the loss

  StepValuesCarrier(int world, int rank, const at::TensorOptions& options);

  // Handed to the Reducer beside the model's parameters; never to an optimizer or a checkpoint.
  const at::Tensor& parameter() const { return parameter_; }

  // `scaled` plus the term carrying `row` (this rank's loss then its values, float64, on the
  // carrier's device, at most 1 + kMaxValues of them): the loss the synchronised backward runs.
  at::Tensor attach(const at::Tensor& scaled, const at::Tensor& row);

  // Before each step's backward: the last step's gradient must not be added to.
  void clear_gradient();

  // After the buckets: every rank's pieces as the Reducer left them (divided by the world size),
  // float32 on the device, to be read with the step's statistics.
  at::Tensor gathered() const;

  // The values read from gathered(), in order, back to `row_length` float64 values per rank,
  // rank by rank. Throws Error(internal) where a piece is not an integer divided by the world
  // size (a Reducer that did not sum, or a rank whose row was not the same length).
  std::vector<double> decode(const std::vector<double>& read, int64_t row_length) const;

  // The ranks' mean loss (every row's first value) from gathered(), on its device without a host
  // read (the deferred step's): float64, 0-dim, the bits decode() gives, summed in rank order from
  // 0 and divided by the world size, as the synchronous step makes it on the host. Unchecked: the
  // host decodes the same pieces when the record arrives and compares.
  at::Tensor mean_loss(const at::Tensor& gathered) const;

  int world() const { return world_; }

 private:
  int world_;
  int rank_;
  at::Tensor parameter_;
  at::Tensor shifts_;  // 0, 16, 32, 48: the pieces of a value's 64 bits
};

}  // namespace ampkit
