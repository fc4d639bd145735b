// The step's small values carried in the gradient buckets (step_values_carrier.h).
#include "ampkit/step_values_carrier.h"

#include <ATen/ops/add.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/div.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/round.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstring>
#include <string>

#include "ampkit/error.h"

namespace ampkit {

namespace {
constexpr int64_t kPieces = 4;  // 16 bits each
constexpr int64_t kRowSlots = 1 + StepValuesCarrier::kMaxValues;
}  // namespace

StepValuesCarrier::StepValuesCarrier(int world, int rank, const at::TensorOptions& options)
    : world_(world), rank_(rank) {
  parameter_ = at::zeros({world, kRowSlots, kPieces}, options.dtype(at::kFloat)).requires_grad_(true);
  shifts_ = at::tensor({int64_t{0}, int64_t{16}, int64_t{32}, int64_t{48}}, at::kLong).to(options.device());
}

at::Tensor StepValuesCarrier::attach(const at::Tensor& scaled, const at::Tensor& row) {
  const int64_t n = row.numel();
  if (n < 1 || n > kRowSlots)
    throw Error(ErrorCategory::internal, "a rank's step values must be 1 to " + std::to_string(kRowSlots) +
                                             " (its loss and at most " + std::to_string(kMaxValues) +
                                             " more), got " + std::to_string(n));
  // The bits of each value, 16 at a time, as floats 0-65535 (exact): never NaN or infinite, so
  // the term below is exactly 0 and the loss the backward starts from is unchanged.
  const at::Tensor bits = row.detach().to(at::kDouble).contiguous().view(at::kLong).reshape({n, 1});
  const at::Tensor pieces = at::bitwise_and(at::bitwise_right_shift(bits, shifts_), 0xFFFF).to(at::kFloat);
  const at::Tensor mine = parameter_.view({-1}).narrow(0, rank_ * kRowSlots * kPieces, n * kPieces);
  return at::add(scaled, at::mul(mine, pieces.view({-1})).sum());
}

void StepValuesCarrier::clear_gradient() {
  parameter_.mutable_grad() = at::Tensor();
}

at::Tensor StepValuesCarrier::gathered() const {
  const at::Tensor& grad = parameter_.grad();
  if (!grad.defined())
    throw Error(ErrorCategory::internal, "the step's values did not reach the gradient buckets");
  return grad;
}

std::vector<double> StepValuesCarrier::decode(const std::vector<double>& read, int64_t row_length) const {
  if (static_cast<int64_t>(read.size()) != world_ * kRowSlots * kPieces)
    throw Error(ErrorCategory::internal, "the step values read hold " + std::to_string(read.size()) +
                                             " numbers, expected " +
                                             std::to_string(world_ * kRowSlots * kPieces));
  std::vector<double> out;
  out.reserve(static_cast<size_t>(world_ * row_length));
  for (int64_t r = 0; r < world_; ++r)
    for (int64_t v = 0; v < row_length; ++v) {
      uint64_t bits = 0;
      for (int64_t p = 0; p < kPieces; ++p) {
        const double scaled = read[static_cast<size_t>((r * kRowSlots + v) * kPieces + p)] * world_;
        const double piece = std::nearbyint(scaled);
        if (!(std::fabs(scaled - piece) < 0.25) || piece < 0 || piece > 65535)
          throw Error(ErrorCategory::internal,
                      "rank " + std::to_string(r) + "'s step values arrived damaged (" +
                          std::to_string(scaled) +
                          " is not a 16-bit piece; did the Reducer not sum the gradients?)");
        bits |= static_cast<uint64_t>(piece) << (16 * p);
      }
      double value;
      std::memcpy(&value, &bits, sizeof value);
      out.push_back(value);
    }
  return out;
}

at::Tensor StepValuesCarrier::mean_loss(const at::Tensor& gathered) const {
  // Each rank's four pieces of its loss, times the world size and rounded back to the integers
  // they were (exact in float64, as decode() makes them), then put together bit by bit.
  const at::Tensor pieces = at::round(gathered.select(1, 0).to(at::kDouble).mul(world_)).to(at::kLong);
  at::Tensor bits = pieces.select(1, 0);
  for (int64_t p = 1; p < kPieces; ++p)
    bits = at::bitwise_or(bits, at::bitwise_left_shift(pieces.select(1, p), 16 * p));
  const at::Tensor losses = bits.contiguous().view(at::kDouble);
  at::Tensor sum = at::zeros({}, losses.options());
  for (int64_t r = 0; r < world_; ++r) sum = at::add(sum, losses.select(0, r));
  // Divided by a tensor on the sum's device: for a plain-number divisor CUDA multiplies by its
  // reciprocal, which is not the host's sum / world (1 in 3 doubles differ for world 3).
  return at::div(sum, at::scalar_tensor(static_cast<double>(world_), sum.options()));
}

}  // namespace ampkit
