// The chunk_kernel statistics recipe (issue 32) on CPU tensors, where the host computes each
// chunk as one kernel block would: the plan (chunks of at most 65,536 elements, one launch per
// dtype whatever the tensor count) and the combination per tensor, against the fused scan (float)
// and the foreach recipe (half, bfloat16), special values included. test_on_device runs the
// kernel itself on a GPU (tools/gpu-check.sh).
#define BOOST_TEST_MODULE stats_chunk_kernel
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"

using namespace ampkit;

namespace {

GradStats recipe(const std::vector<at::Tensor>& grads, DeviceStatsRecipe r,
                 std::vector<double>* values = nullptr, const std::vector<at::Tensor>& scalars = {}) {
  std::vector<double> v;
  GradStats s = compute_grad_stats_on_device(grads, scalars, v, r);
  if (values != nullptr) *values = v;
  return s;
}

// Gradients crossing chunk boundaries, with exact zeros, tiny and large values.
std::vector<at::Tensor> sample_grads(at::ScalarType dtype) {
  at::manual_seed(3);
  std::vector<at::Tensor> grads = {
      at::randn({65536 * 2 + 5}),  at::randn({17, 3}) * 1e-30, at::Tensor(), at::randn({0}),
      at::randn({300, 700}) * 5e3, at::randn({65536})};
  grads[0].narrow(0, 1000, 70000).zero_();
  grads[5].index_put_({at::arange(0, 65536, 7)}, 0.0);
  for (auto& g : grads)
    if (g.defined()) g = g.to(dtype);
  return grads;
}

void check_close(const GradStats& got, const GradStats& want, double rel) {
  BOOST_TEST(got.sum_squares == want.sum_squares, boost::test_tools::tolerance(rel));
  BOOST_TEST(got.max_abs == want.max_abs);
  BOOST_TEST(got.zeros == want.zeros);
  BOOST_TEST(got.elements == want.elements);
  BOOST_REQUIRE(got.tensor_sum_squares.size() == want.tensor_sum_squares.size());
  for (size_t t = 0; t < got.tensor_sum_squares.size(); ++t)
    BOOST_TEST(got.tensor_sum_squares[t] == want.tensor_sum_squares[t], boost::test_tools::tolerance(rel));
}

}  // namespace

BOOST_AUTO_TEST_CASE(chunks_cover_every_element_once_with_one_launch_per_dtype) {
  const std::vector<at::Tensor> grads = {
      at::zeros({65536 * 2 + 5}),    at::Tensor(),       at::zeros({0}),
      at::zeros({3}, at::kBFloat16), at::zeros({65536}), at::zeros({9}, at::kHalf)};
  const StatsPlan plan = plan_stats_chunks(grads);
  BOOST_REQUIRE(plan.chunks.size() == 6u);  // 3 + 1 float, then half, then bfloat16
  const std::vector<size_t> tensors = {0, 0, 0, 4, 5, 3};
  const std::vector<int64_t> elements = {65536, 65536, 5, 65536, 9, 3};
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    BOOST_TEST(plan.chunks[c].tensor == tensors[c]);
    BOOST_TEST(plan.chunks[c].elements == elements[c]);
  }
  BOOST_TEST(plan.chunks[1].address == static_cast<const char*>(grads[0].data_ptr()) + 65536 * 4);
  BOOST_TEST(plan.chunks[2].address == static_cast<const char*>(grads[0].data_ptr()) + 2 * 65536 * 4);
  BOOST_REQUIRE(plan.launches.size() == 3u);
  BOOST_TEST(
      (plan.launches[0].dtype == at::kFloat && plan.launches[0].first == 0 && plan.launches[0].count == 4));
  BOOST_TEST(
      (plan.launches[1].dtype == at::kHalf && plan.launches[1].first == 4 && plan.launches[1].count == 1));
  BOOST_TEST((plan.launches[2].dtype == at::kBFloat16 && plan.launches[2].first == 5));
  // The launch count does not grow with the number of tensors: 10 or 1,000, one launch.
  for (int n : {10, 1000}) {
    std::vector<at::Tensor> many;
    for (int i = 0; i < n; ++i) many.push_back(at::ones({5}));
    const StatsPlan p = plan_stats_chunks(many);
    BOOST_TEST(p.launches.size() == 1u);
    BOOST_TEST(p.chunks.size() == static_cast<size_t>(n));
  }
}

BOOST_AUTO_TEST_CASE(float_gradients_match_the_fused_scan) {
  const std::vector<at::Tensor> grads = sample_grads(at::kFloat);
  std::vector<double> values;
  const GradStats got =
      recipe(grads, DeviceStatsRecipe::chunk_kernel, &values, {at::tensor({2.5, -1.0}, at::kDouble)});
  check_close(got, compute_grad_stats(grads), 1e-9);
  BOOST_TEST(got.zeros >= 70000 + 65536 / 7);
  BOOST_TEST(values == (std::vector<double>{2.5, -1.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(half_and_bfloat16_gradients_match_the_foreach_recipe) {
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    std::vector<at::Tensor> grads = sample_grads(dtype);
    grads[1] = grads[1].to(at::kFloat) * 0 + 1;  // a float gradient beside them: two launches
    BOOST_TEST_CONTEXT(c10::toString(dtype)) {
      check_close(recipe(grads, DeviceStatsRecipe::chunk_kernel),
                  recipe(grads, DeviceStatsRecipe::foreach_ops), 1e-6);
    }
  }
}

BOOST_AUTO_TEST_CASE(infinities_and_nans_read_as_the_other_recipes_do) {
  std::vector<at::Tensor> grads = sample_grads(at::kFloat);
  grads[4][7][9] = std::numeric_limits<float>::infinity();
  GradStats got = recipe(grads, DeviceStatsRecipe::chunk_kernel);
  BOOST_TEST(std::isinf(got.sum_squares));
  BOOST_TEST(std::isinf(got.max_abs));
  BOOST_TEST(!got.finite());
  BOOST_TEST(got.zeros == compute_grad_stats(grads).zeros);
  grads[0][65536 + 3] = std::numeric_limits<float>::quiet_NaN();  // in tensor 0's second chunk
  got = recipe(grads, DeviceStatsRecipe::chunk_kernel);
  const GradStats foreach_ops = recipe(grads, DeviceStatsRecipe::foreach_ops);
  BOOST_TEST(std::isnan(got.sum_squares));
  BOOST_TEST(std::isnan(got.max_abs));
  BOOST_TEST(std::isnan(got.tensor_sum_squares[0]));
  BOOST_TEST(std::isinf(got.tensor_sum_squares[4]));
  BOOST_TEST(got.tensor_sum_squares[5] == foreach_ops.tensor_sum_squares[5],
             boost::test_tools::tolerance(1e-9));
  BOOST_TEST(got.zeros == foreach_ops.zeros);  // the tensor with the NaN counts no zeros
  BOOST_TEST(got.zeros < compute_grad_stats(grads).zeros);
}

BOOST_AUTO_TEST_CASE(other_dtypes_are_refused_in_one_line) {
  const std::vector<at::Tensor> grads = {at::ones({3}, at::kDouble)};
  try {
    recipe(grads, DeviceStatsRecipe::chunk_kernel);
    BOOST_FAIL("a float64 gradient was accepted");
  } catch (const Error& e) {
    BOOST_TEST((e.category() == ErrorCategory::usage));
    BOOST_TEST(std::string(e.what()).find("float, half and bfloat16") != std::string::npos, e.what());
  }
}
