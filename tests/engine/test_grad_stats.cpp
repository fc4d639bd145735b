// The statistics pass and the single unscale-and-clip multiply: the same numbers as PyTorch's
// GradScaler.unscale_ + clip_grad_norm_, zeros and non-finite values found on every path, and the
// device path's packed statistics equal to the CPU fast path's.
#define BOOST_TEST_MODULE grad_stats
#include <ATen/ATen.h>
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

// The device path of the statistics pass (issue 20), run on CPU tensors: the same statistics as
// the fast path, from one packed tensor.
BOOST_AUTO_TEST_CASE(device_path_statistics_equal_the_fast_path) {
  for (double scale : {1.0, 65536.0}) {
    std::vector<at::Tensor> grads = make_grads(11, scale);
    grads[1].view(-1).slice(0, 0, 100).zero_();     // exact zeros to count
    grads.insert(grads.begin() + 2, at::Tensor());  // an undefined gradient counts as empty
    const GradStats fast = compute_grad_stats(grads);
    std::vector<double> scalars;
    const GradStats device = compute_grad_stats_on_device(grads, {at::full({}, 2.5f)}, scalars);
    BOOST_TEST_CONTEXT("scale " << scale) {
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
    BOOST_TEST(!compute_grad_stats_on_device(grads, {}, scalars).finite());
  }
}
