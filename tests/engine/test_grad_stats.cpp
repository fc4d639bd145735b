// The statistics pass and the single unscale-and-clip multiply: the same numbers as PyTorch's
// GradScaler.unscale_ + clip_grad_norm_, zeros and non-finite values found on every path, and the
// device path's packed statistics equal to the CPU fast path's.
#define BOOST_TEST_MODULE grad_stats
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/nn/utils/clip_grad.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "ampkit/grad_stats.h"
#include "ampkit/strategy_set.h"
#include "builtin_plugins.h"
#include "pytorch_reference.h"
#include "tensor_compare.h"

using namespace ampkit;
using ampkit::test::clone_all;
using ampkit::test::max_rel_error;
using ampkit::test::reference_unscale_and_clip;
using Plugins = ampkit::test::BuiltinPlugins;

namespace {

// Gradients of many shapes with values spread over several orders of magnitude, as scaled
// fp16-training gradients look.
std::vector<at::Tensor> make_grads(int64_t seed, double scale) {
  at::manual_seed(seed);
  std::vector<at::Tensor> grads;
  const std::vector<std::vector<int64_t>> shapes = {{7},       {64, 33}, {1},       {128},
                                                    {3, 5, 7}, {200000}, {513, 129}};
  for (const auto& s : shapes) grads.push_back(at::randn(s) * at::exp(at::randn(s) * 2) * scale);
  return grads;
}

// Operators called by the code under test itself (depth 0); those an operator calls inside (a
// CPU _foreach_* runs one per tensor) are its own business.
thread_local int t_depth = 0;
thread_local int64_t t_top_level_ops = 0;

std::unique_ptr<at::ObserverContext> op_started(const at::RecordFunction&) {
  if (t_depth++ == 0) ++t_top_level_ops;
  return nullptr;
}

void op_ended(const at::RecordFunction&, at::ObserverContext*) {
  --t_depth;
}

int64_t top_level_ops_of_device_stats(int64_t tensors, int64_t elements) {
  std::vector<at::Tensor> grads;
  for (int64_t t = 0; t < tensors; ++t) grads.push_back(at::randn({elements / tensors}));
  std::vector<double> loss;
  const at::Tensor device_loss = at::full({}, 1.5);
  t_top_level_ops = 0;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(op_started, op_ended).scopes({at::RecordScope::FUNCTION}));
  const GradStats stats =
      compute_grad_stats_on_device(grads, {device_loss}, loss, DeviceStatsRecipe::foreach_ops);
  at::removeCallback(handle);
  BOOST_TEST(t_depth == 0);
  BOOST_TEST(stats.elements == elements);
  BOOST_TEST(loss == std::vector<double>({1.5}), boost::test_tools::per_element());
  return t_top_level_ops;
}

}  // namespace

BOOST_AUTO_TEST_CASE(stats_and_single_multiply_match_unscale_then_clip_grad_norm) {
  Plugins plugins;
  for (const std::string norm_type : {"2", "inf"}) {
    for (const double max_norm : {0.5, 1e9}) {  // clipping active, and a threshold never reached
      const double scale = 65536.0;
      std::vector<at::Tensor> ours = make_grads(7, scale);
      std::vector<at::Tensor> ref = clone_all(ours);
      std::vector<at::Tensor> ref32 = clone_all(ours);

      auto set = plugins.strategies(
          {{"clipper",
            Plugins::choice("norm", {{"max_norm", std::to_string(max_norm)}, {"norm_type", norm_type}})}});
      const GradStats g = compute_grad_stats(ours);
      StepStats stats;
      stats.scale = scale;
      stats.grad_norm = std::sqrt(g.sum_squares) / scale;
      stats.grad_max_abs = g.max_abs / scale;
      const ClipResult clip = set->clipper().clip(stats);
      scale_grads_(ours, clip.coefficient / scale);

      const double ref_norm =
          reference_unscale_and_clip(ref, scale, max_norm, norm_type == "inf" ? INFINITY : 2.0);
      // The fp32 PyTorch sequence, as users run it: same result within its own rounding.
      at::Tensor found_inf = at::zeros({1});
      at::_amp_foreach_non_finite_check_and_unscale_(ref32, found_inf, at::full({1}, 1.0 / scale));
      std::vector<at::Tensor> params32;
      for (auto& t : ref32) {
        params32.push_back(at::zeros_like(t).requires_grad_(true));
        params32.back().mutable_grad() = t;
      }
      torch::nn::utils::clip_grad_norm_(params32, max_norm, norm_type == "inf" ? INFINITY : 2.0);
      const double our_norm = norm_type == "inf" ? stats.grad_max_abs : stats.grad_norm;
      BOOST_TEST_CONTEXT("norm_type " << norm_type << " max_norm " << max_norm) {
        BOOST_TEST(std::abs(our_norm - ref_norm) / ref_norm < 1e-6);
        BOOST_TEST(max_rel_error(ours, ref) < 1e-6);
        BOOST_TEST(max_rel_error(ours, ref32) < 5e-5);
        BOOST_TEST(found_inf.item<float>() == 0.0f);
        if (max_norm < 1)
          BOOST_TEST(clip.coefficient < 1.0);
        else
          BOOST_TEST(clip.coefficient == 1.0);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(stats_pass_counts_zeros_max_and_detects_non_finite) {
  std::vector<at::Tensor> grads = {at::tensor({0.0f, -3.0f, 4.0f, 0.0f}), at::tensor({12.0f})};
  GradStats g = compute_grad_stats(grads);
  BOOST_TEST(g.sum_squares == 169.0);
  BOOST_TEST(g.max_abs == 12.0);
  BOOST_TEST(g.zeros == 2);
  BOOST_TEST(g.elements == 5);
  BOOST_TEST(g.tensor_sum_squares.size() == 2u);
  BOOST_TEST(g.tensor_sum_squares[0] == 25.0);
  BOOST_TEST(g.finite());
  // Large tensors take the parallel path; one NaN or inf anywhere must surface.
  for (float bad : {NAN, INFINITY}) {
    at::Tensor big = at::ones({1 << 20});
    big[777777] = bad;
    BOOST_TEST(!compute_grad_stats({big}).finite());
  }
  at::Tensor big = at::full({1 << 20}, 2.0f);
  g = compute_grad_stats({big});
  BOOST_TEST(g.sum_squares == 4.0 * (1 << 20));
}

// The device path of the statistics pass, run on CPU tensors with both recipes:
// the same statistics as the fast path, from one packed tensor.
BOOST_AUTO_TEST_CASE(device_path_statistics_equal_the_fast_path) {
  for (const auto recipe : {DeviceStatsRecipe::foreach_ops, DeviceStatsRecipe::fused_scan})
    for (double scale : {1.0, 65536.0}) {
      std::vector<at::Tensor> grads = make_grads(11, scale);
      grads[1].view(-1).slice(0, 0, 100).zero_();     // exact zeros to count
      grads.insert(grads.begin() + 2, at::Tensor());  // an undefined gradient counts as empty
      const GradStats fast = compute_grad_stats(grads);
      std::vector<double> scalars;
      const GradStats device = compute_grad_stats_on_device(grads, {at::full({}, 2.5f)}, scalars, recipe);
      BOOST_TEST_CONTEXT("recipe " << static_cast<int>(recipe) << ", scale " << scale) {
        BOOST_TEST(std::abs(device.sum_squares - fast.sum_squares) <= 1e-6 * fast.sum_squares);
        BOOST_TEST(device.max_abs == fast.max_abs);
        BOOST_TEST(device.zeros == fast.zeros);
        BOOST_TEST(device.zeros >= 100);
        BOOST_TEST(device.elements == fast.elements);
        BOOST_REQUIRE(device.tensor_sum_squares.size() == fast.tensor_sum_squares.size());
        for (size_t t = 0; t < fast.tensor_sum_squares.size(); ++t)
          BOOST_TEST(std::abs(device.tensor_sum_squares[t] - fast.tensor_sum_squares[t]) <=
                     1e-6 * fast.tensor_sum_squares[t]);
        BOOST_TEST(scalars == std::vector<double>({2.5}), boost::test_tools::per_element());
      }
    }
  for (float bad : {NAN, INFINITY}) {
    std::vector<at::Tensor> grads = make_grads(12, 1.0);
    grads[5][1234] = bad;
    std::vector<double> scalars;
    BOOST_TEST(!compute_grad_stats_on_device(grads, {}, scalars, DeviceStatsRecipe::foreach_ops).finite());
    BOOST_TEST(!compute_grad_stats_on_device(grads, {}, scalars, DeviceStatsRecipe::fused_scan).finite());
  }
}

// foreach_ops groups gradients by dtype and cuts those above 64 MiB into parts: the statistics
// still come per gradient, and a part holding NaN counts no zeros (sign(NaN) is 0).
BOOST_AUTO_TEST_CASE(foreach_recipe_cuts_big_gradients_and_groups_dtypes) {
  at::manual_seed(3);
  at::Tensor big = at::rand({40 << 20}) + 0.5;  // 160 MiB: three parts; no zero but those set
  big.slice(0, 0, 1000).zero_();
  big.slice(0, (40 << 20) - 500, 40 << 20).zero_();
  const at::Tensor half = (at::rand({3000}) - 2.0).to(at::kBFloat16);
  half.slice(0, 0, 7).zero_();
  const std::vector<at::Tensor> grads = {at::randn({33}), big, half};
  const GradStats fast = compute_grad_stats(grads);
  std::vector<double> none;
  const GradStats device = compute_grad_stats_on_device(grads, {}, none, DeviceStatsRecipe::foreach_ops);
  BOOST_TEST(device.zeros == 1507);
  BOOST_TEST(fast.zeros == 1507);
  BOOST_TEST(device.elements == fast.elements);
  BOOST_TEST(device.max_abs == fast.max_abs);
  for (size_t t = 0; t < grads.size(); ++t)
    BOOST_TEST(std::abs(device.tensor_sum_squares[t] - fast.tensor_sum_squares[t]) <=
               1e-6 * fast.tensor_sum_squares[t]);
  half[100] = NAN;
  const GradStats nan = compute_grad_stats_on_device(grads, {}, none, DeviceStatsRecipe::foreach_ops);
  BOOST_TEST(std::isnan(nan.max_abs));
  BOOST_TEST(!nan.finite());
  BOOST_TEST(nan.zeros == 1500);  // the bf16 gradient's 7 zeros are not counted
}

// The device path's operator count does not grow with the number of gradients (what a
// GPU pays in kernel launches): 10 and 1,000 gradients of the same 400 KB take the same operators.
BOOST_AUTO_TEST_CASE(device_path_operators_do_not_grow_with_the_tensor_count) {
  const int64_t ten = top_level_ops_of_device_stats(10, 100000);
  const int64_t thousand = top_level_ops_of_device_stats(1000, 100000);
  BOOST_TEST_MESSAGE("top-level operators: " << ten << " for 10 gradients, " << thousand << " for 1,000");
  BOOST_TEST(ten > 0);
  BOOST_TEST(thousand == ten);
  BOOST_TEST(ten <= 16);
}
