// ampkit-train's fp8 linear layers (Fp8Linears) on their own: a non-finite amax makes the weight
// gradient NaN, as ampkit.fp8's does, so the NaN policy sees the step as bad even where the casts
// clamped the inf away and no bias gradient carries it.
#define BOOST_TEST_MODULE fp8_linears
#include <ATen/ATen.h>
#include <ampkit/fp8_recipe.h>

#include <boost/test/unit_test.hpp>
#include <limits>

#include "builtin_plugins.h"
#include "workloads/fp8_linear.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The weight gradient of one bias-free layer after a forward of `x` and a backward of `grad`;
// `out_finite` says whether the forward's output was finite.
at::Tensor weight_grad(ampkit::train::Fp8Linears& layers, const at::Tensor& x, const at::Tensor& grad,
                       bool& out_finite) {
  at::manual_seed(0);
  const at::Tensor weight = at::randn({16, 16}).requires_grad_();
  const at::Tensor out = layers.linear(0, x, weight, at::Tensor());
  out_finite = out.isfinite().all().item<bool>();
  out.backward(grad);
  return weight.grad();
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_non_finite_amax_makes_the_weight_gradient_nan) {
  ampkit::test::BuiltinPlugins plugins;
  const auto strategy = plugins.make("fp8_recipe", "delayed", {{"amax_history_len", "4"}});
  auto& recipe = dynamic_cast<ampkit::Fp8Recipe&>(*strategy);
  ampkit::train::Fp8Linears layers(recipe, "delayed", 1, at::Device(at::kCPU));
  at::manual_seed(1);
  const at::Tensor x = at::randn({8, 16});
  const at::Tensor ones = at::ones({8, 16});
  bool finite = false;

  // Finite tensors: a finite gradient.
  BOOST_TEST(weight_grad(layers, x, ones, finite).isfinite().all().item<bool>());
  BOOST_TEST(finite);

  // An inf in grad_output: its cast clamps it to e5m2's maximum, yet every element of the weight
  // gradient is NaN.
  const at::Tensor bad_grad = ones.clone();
  bad_grad[0][0] = kInf;
  const at::Tensor g = weight_grad(layers, x, bad_grad, finite);
  BOOST_TEST(g.isnan().all().item<bool>(), g);

  // An inf in the input: the forward's output stays finite (the cast clamps it), the weight
  // gradient is NaN.
  const at::Tensor bad_x = x.clone();
  bad_x[3][5] = kInf;
  const at::Tensor gx = weight_grad(layers, bad_x, ones, finite);
  BOOST_TEST(finite);
  BOOST_TEST(gx.isnan().all().item<bool>(), gx);
}
