// The step's values carried in the gradient buckets (StepValuesCarrier): every value
// arrives bit for bit on every rank after the Reducer's all-reduce (each gradient multiplied by
// 1 / world, then summed), for world sizes whose inverse is not exact in fp32; the loss the
// backward starts from and the model's gradients are untouched. The Reducer is simulated here
// exactly as reducer.cpp's copy into the bucket does it (mul by a wrapped 1.0 / world, in fp32);
// tests/dist/test_step_collectives runs the real one.
#define BOOST_TEST_MODULE step_values_carrier
#include <ATen/ATen.h>
#include <ampkit/error.h>
#include <ampkit/step_values_carrier.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <vector>

#include "cuda_division.h"

using namespace ampkit;

namespace {

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Rank r's row: values no float can hold, every special value, and one tagged with the rank.
std::vector<double> row_of(int r) {
  return {0.1 + r,  // the loss: not exact in fp32
          std::numeric_limits<double>::quiet_NaN(),
          std::numeric_limits<double>::infinity(),
          -std::numeric_limits<double>::infinity(),
          -0.0,
          4.9e-324,  // the smallest subnormal
          -1.7976931348623157e308,
          12345.678901234567 * (r + 1),
          static_cast<double>(r)};
}

// What every rank holds after the all-reduce: the sum over ranks of each rank's carrier gradient
// multiplied by 1 / world in fp32, read as float64. Checks on the way that each rank's loss is
// unchanged by attach() and that its own gradient is untouched.
std::vector<double> reduce(int world, const at::Device& device) {
  at::Tensor bucket;
  for (int r = 0; r < world; ++r) {
    StepValuesCarrier carrier(world, r, at::TensorOptions().device(device));
    const at::Tensor w = at::full({3}, 2.0, at::TensorOptions().device(device)).requires_grad_(true);
    const at::Tensor scaled = (w * w).sum() * 1024.0;
    const std::vector<double> row = row_of(r);
    const at::Tensor attached =
        carrier.attach(scaled, at::tensor(row, at::TensorOptions().dtype(at::kDouble)).to(device));
    BOOST_TEST(attached.item<float>() == scaled.item<float>());  // exactly: the term is 0
    attached.backward();
    BOOST_TEST(w.grad().cpu().equal(at::full({3}, 4096.0)));              // 2 x 2 x 1024, exactly
    const at::Tensor divided = at::mul(carrier.gathered(), 1.0 / world);  // reducer.cpp's mul_out
    bucket = bucket.defined() ? bucket + divided : divided;
  }
  const at::Tensor read = bucket.to(at::kDouble).cpu().contiguous();
  return std::vector<double>(read.data_ptr<double>(), read.data_ptr<double>() + read.numel());
}

void check_round_trip(int world, const at::Device& device) {
  StepValuesCarrier any(world, 0, at::TensorOptions().device(device));
  const int64_t row_length = static_cast<int64_t>(row_of(0).size());
  const std::vector<double> got = any.decode(reduce(world, device), row_length);
  BOOST_REQUIRE(got.size() == static_cast<size_t>(world * row_length));
  for (int r = 0; r < world; ++r)
    for (int64_t v = 0; v < row_length; ++v)
      BOOST_TEST_CONTEXT("world " << world << ", rank " << r << ", value " << v) {
        BOOST_TEST(bits_of(got[static_cast<size_t>(r * row_length + v)]) == bits_of(row_of(r)[v]));
      }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_value_arrives_bit_for_bit_on_every_world_size) {
  for (int world : {2, 3, 5, 7, 64, 1000}) check_round_trip(world, at::kCPU);
}

BOOST_AUTO_TEST_CASE(a_bucket_not_summed_by_the_world_size_is_refused) {
  const std::vector<double> read = reduce(3, at::kCPU);
  StepValuesCarrier wrong_world(2, 0, at::TensorOptions());
  BOOST_CHECK_THROW(wrong_world.decode(read, 9), Error);  // its size is that of 3 ranks
  std::vector<double> damaged = read;
  damaged[5] += 0.3 / 3;  // a piece that is no longer an integer divided by the world size
  StepValuesCarrier carrier(3, 0, at::TensorOptions());
  try {
    carrier.decode(damaged, 9);
    BOOST_FAIL("a damaged piece was decoded");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("rank 0's step values arrived damaged") != std::string::npos,
               e.what());
  }
}

BOOST_AUTO_TEST_CASE(a_row_longer_than_the_carrier_is_refused) {
  StepValuesCarrier carrier(2, 1, at::TensorOptions());
  const at::Tensor w = at::ones({1}).requires_grad_(true);
  const at::Tensor too_long = at::zeros({StepValuesCarrier::kMaxValues + 2}, at::kDouble);
  BOOST_CHECK_THROW(carrier.attach(w.sum(), too_long), Error);
  BOOST_CHECK_THROW(carrier.gathered(), Error);  // no backward yet: nothing gathered
}

BOOST_AUTO_TEST_CASE(clearing_the_gradient_keeps_the_last_step_from_adding_to_the_next) {
  StepValuesCarrier carrier(2, 0, at::TensorOptions());
  for (int step = 0; step < 2; ++step) {
    carrier.clear_gradient();
    const at::Tensor w = at::ones({1}).requires_grad_(true);
    carrier.attach(w.sum(), at::tensor({3.0 + step}, at::kDouble)).backward();
  }
  const at::Tensor read = carrier.gathered().to(at::kDouble).contiguous();
  std::vector<double> values(read.data_ptr<double>(), read.data_ptr<double>() + read.numel());
  for (double& v : values) v /= 2;  // as the Reducer leaves them
  BOOST_TEST(carrier.decode(values, 1) == (std::vector<double>{4.0, 0.0}), boost::test_tools::per_element());
}

// The deferred step's mean loss (mean_loss, on the device) is compared by bits with the host's
// sum / world when its record arrives. With 3 ranks whose losses sum to 4.9, a division by the
// plain number 3 gives 1.6333333333333333 on CUDA (4.9 * (1/3)) where the host gives
// 1.6333333333333335: the divisor must be a tensor on the device, which CUDA really divides by.
BOOST_AUTO_TEST_CASE(the_mean_loss_divides_as_the_host_does_under_cudas_rounding) {
  const test::CudaDivision cuda_rounding;
  const int world = 3;
  const std::vector<double> losses{0.7, 1.3, 2.9};
  const double sum = (losses[0] + losses[1]) + losses[2];  // rank order, as the host sums
  const at::Tensor plain = at::div(at::scalar_tensor(sum, at::kDouble), world);
  BOOST_REQUIRE(bits_of(plain.item<double>()) == bits_of(sum * (1.0 / world)));  // the emulation is on
  BOOST_REQUIRE(bits_of(sum * (1.0 / world)) != bits_of(sum / world));           // and it matters here
  at::Tensor bucket;
  for (int r = 0; r < world; ++r) {
    StepValuesCarrier carrier(world, r, at::TensorOptions());
    const at::Tensor w = at::ones({1}).requires_grad_(true);
    carrier.attach(w.sum(), at::tensor({losses[static_cast<size_t>(r)]}, at::kDouble)).backward();
    const at::Tensor divided = at::mul(carrier.gathered(), 1.0 / world);  // reducer.cpp's mul_out
    bucket = bucket.defined() ? bucket + divided : divided;
  }
  const StepValuesCarrier carrier(world, 0, at::TensorOptions());
  const double mean = carrier.mean_loss(bucket).item<double>();
  BOOST_TEST(bits_of(mean) == bits_of(sum / world), std::setprecision(17)
                                                        << mean << " vs the host's " << sum / world);
}
