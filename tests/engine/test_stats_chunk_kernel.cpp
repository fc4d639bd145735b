// The chunk_kernel statistics recipe on CPU tensors, where the host computes each
// chunk as one kernel block would: the plan (chunks of at most 65,536 elements, one launch per
// dtype whatever the tensor count) and the combination per tensor, against the fused scan (float)
// and the foreach recipe (half, bfloat16), special values included. test_on_device runs the
// kernel itself on a GPU (tools/gpu-check.sh).
#define BOOST_TEST_MODULE stats_chunk_kernel
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/gradient_table.h"

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

// Every recipe measures the gradients of one device: gradients on two CUDA devices, or on a CUDA
// device and the CPU, are refused whichever recipe is asked for (the chunk kernel's address table
// would hold another device's pointers: an illegal address on the GPU, a segfault on the host).
BOOST_AUTO_TEST_CASE(every_recipe_refuses_parameters_on_several_devices) {
  StatsRecipeFacts gpu_and_cpu;
  gpu_and_cpu.cuda_devices = 1;
  gpu_and_cpu.cpu_tensors = gpu_and_cpu.kernel_dtypes = gpu_and_cpu.kernel_built = true;
  StatsRecipeFacts two_gpus = gpu_and_cpu;
  two_gpus.cuda_devices = 2;
  two_gpus.cpu_tensors = false;
  StatsRecipeFacts three_gpus_and_cpu = gpu_and_cpu;
  three_gpus_and_cpu.cuda_devices = 3;
  const std::pair<StatsRecipeFacts, std::string> cases[] = {
      {gpu_and_cpu, "on 1 CUDA device and the CPU"},
      {two_gpus, "on 2 CUDA devices:"},
      {three_gpus_and_cpu, "on 3 CUDA devices and the CPU"}};
  int refused = 0;
  for (const auto& [facts, where] : cases)
    for (const DeviceStatsRecipe recipe : kStatsRecipes) {
      BOOST_TEST_CONTEXT(to_string(recipe) << ", " << where) {
        try {
          choose_stats_recipe(recipe, facts);
          BOOST_ERROR("parameters on several devices were accepted");
        } catch (const Error& e) {
          ++refused;
          BOOST_TEST((e.category() == ErrorCategory::usage));
          BOOST_TEST(std::string(e.what()).find(where) != std::string::npos, e.what());
          BOOST_TEST(std::string(e.what()).find(std::string("recipe '") + to_string(recipe) + "'") !=
                         std::string::npos,
                     e.what());
        }
      }
    }
  BOOST_TEST(refused == 12);
  // One device of either kind is no mixture.
  StatsRecipeFacts one_gpu = two_gpus;
  one_gpu.cuda_devices = 1;
  StatsRecipeFacts cpu_only = gpu_and_cpu;
  cpu_only.cuda_devices = 0;
  for (const DeviceStatsRecipe recipe : kStatsRecipes) {
    BOOST_CHECK_NO_THROW(choose_stats_recipe(recipe, one_gpu));
    BOOST_CHECK_NO_THROW(choose_stats_recipe(recipe, cpu_only));
  }
}

// The recipe is chosen once, from the parameters and the build: automatic runs the chunk
// kernel on one CUDA device where it is built, and says why where it falls back.
BOOST_AUTO_TEST_CASE(automatic_takes_the_chunk_kernel_on_a_gpu_where_it_is_built) {
  StatsRecipeFacts gpu;
  gpu.cuda_devices = 1;
  gpu.kernel_dtypes = true;
  gpu.kernel_built = true;
  ResolvedStatsRecipe r = choose_stats_recipe(DeviceStatsRecipe::automatic, gpu);
  BOOST_TEST((r.recipe == DeviceStatsRecipe::chunk_kernel));
  BOOST_TEST(r.fallback.empty());

  StatsRecipeFacts unbuilt = gpu;
  unbuilt.kernel_built = false;
  r = choose_stats_recipe(DeviceStatsRecipe::automatic, unbuilt);
  BOOST_TEST((r.recipe == DeviceStatsRecipe::foreach_ops));
  BOOST_TEST(r.fallback.find("no statistics kernel") != std::string::npos, r.fallback);
  StatsRecipeFacts two = gpu;
  two.cuda_devices = 2;
  BOOST_CHECK_THROW(choose_stats_recipe(DeviceStatsRecipe::automatic, two), Error);  // several devices
  StatsRecipeFacts float64 = gpu;
  float64.kernel_dtypes = false;
  r = choose_stats_recipe(DeviceStatsRecipe::automatic, float64);
  BOOST_TEST((r.recipe == DeviceStatsRecipe::foreach_ops));
  BOOST_TEST(r.fallback.find("neither float, half nor bfloat16") != std::string::npos, r.fallback);

  StatsRecipeFacts cpu_float;
  cpu_float.all_cpu_float = cpu_float.kernel_dtypes = cpu_float.cpu_tensors = true;
  cpu_float.kernel_built = true;
  r = choose_stats_recipe(DeviceStatsRecipe::automatic, cpu_float);
  BOOST_TEST((r.recipe == DeviceStatsRecipe::fused_scan));
  BOOST_TEST(r.fallback.empty());  // nothing to say on a CPU
  StatsRecipeFacts cpu_bf16 = cpu_float;
  cpu_bf16.all_cpu_float = false;
  BOOST_TEST(
      (choose_stats_recipe(DeviceStatsRecipe::automatic, cpu_bf16).recipe == DeviceStatsRecipe::foreach_ops));

  // Forced: kept, checked. The chunk kernel on CPU tensors is the host's emulation, always there.
  BOOST_TEST((choose_stats_recipe(DeviceStatsRecipe::chunk_kernel, cpu_float).recipe ==
              DeviceStatsRecipe::chunk_kernel));
  BOOST_CHECK_THROW(choose_stats_recipe(DeviceStatsRecipe::chunk_kernel, unbuilt), Error);
  BOOST_CHECK_THROW(choose_stats_recipe(DeviceStatsRecipe::chunk_kernel, float64), Error);
  // The real parameters of this (CPU) test: what automatic resolves them to.
  BOOST_TEST((resolve_stats_recipe(DeviceStatsRecipe::automatic, {at::ones({3})}).recipe ==
              DeviceStatsRecipe::fused_scan));
  BOOST_TEST((resolve_stats_recipe(DeviceStatsRecipe::automatic, {at::ones({3}, at::kBFloat16)}).recipe ==
              DeviceStatsRecipe::foreach_ops));
  BOOST_TEST((parse_stats_recipe("chunk_kernel") == DeviceStatsRecipe::chunk_kernel));
  BOOST_CHECK_THROW(parse_stats_recipe("chunk"), Error);
}

// A GradientTable plans its chunks once while the gradients stay where they are, plans again when
// one moves, and measures what a fresh pass measures.
BOOST_AUTO_TEST_CASE(a_gradient_table_plans_once_while_the_gradients_stay) {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (int i = 0; i < 5; ++i) {
    params.push_back(at::zeros({70000 + i}).set_requires_grad(true));
    params.back().mutable_grad() = at::randn({70000 + i});
    names.push_back("p" + std::to_string(i));
  }
  GradientTable table(params, names, DeviceStatsRecipe::chunk_kernel);
  BOOST_TEST((table.recipe() == DeviceStatsRecipe::chunk_kernel));
  const at::Tensor loss = at::full({1}, 2.5, at::kDouble);
  for (int step = 0; step < 3; ++step) {
    table.read_gradients();
    std::vector<double> values;
    const GradStats got = table.measure({loss}, values);
    BOOST_TEST(values == std::vector<double>{2.5});
    check_close(got, recipe(table.gradients(), DeviceStatsRecipe::chunk_kernel), 0.0);
  }
  BOOST_TEST(table.plans_made() == 1);
  params[2].mutable_grad() = at::randn({70002});  // a new gradient: another address
  std::vector<double> values;
  table.read_gradients();
  check_close(table.measure({}, values), recipe(table.gradients(), DeviceStatsRecipe::chunk_kernel), 0.0);
  BOOST_TEST(table.plans_made() == 2);
  params[2].mutable_grad() = at::Tensor();  // no gradient: planned again, counted as empty
  table.read_gradients();
  BOOST_TEST(table.measure({}, values).elements == 4 * 70000 + 0 + 1 + 3 + 4);
  BOOST_TEST(table.plans_made() == 3);
}

// A gradient whose elements fill one block without gaps (a channels_last convolution weight, a
// transposed matrix) is read where it lies: planned once, never copied, with the statistics of the
// same values held contiguously. The values are small integers, so every sum is exact in any order
// and the two agree to the bit. A gradient with gaps is still copied, and planned at every step.
BOOST_AUTO_TEST_CASE(channels_last_gradients_are_planned_once_and_read_where_they_lie) {
  at::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{64, 32, 3, 3}, {7, 9}, {16, 8, 5, 5}};
  const auto values = [&](int step) {  // contiguous, step by step different
    std::vector<at::Tensor> v;
    for (const auto& shape : shapes) v.push_back(at::randint(-8, 9, shape, at::kFloat) * (step + 1));
    v[2] = v[2].to(at::kBFloat16);
    return v;
  };
  std::vector<at::Tensor> params = {at::zeros({64, 32, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast),
                                    at::zeros({9, 7}).t(), at::zeros({16, 8, 5, 5}, at::kBFloat16)};
  params[2] = params[2].contiguous(at::MemoryFormat::ChannelsLast);
  for (auto& p : params) p.set_requires_grad(true);
  std::vector<at::Tensor> dense = {params[0].detach().clone(at::MemoryFormat::ChannelsLast),
                                   params[1].detach().t().contiguous().t(),
                                   params[2].detach().clone(at::MemoryFormat::ChannelsLast)};
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = dense[i];
    BOOST_REQUIRE(!dense[i].is_contiguous());
    BOOST_REQUIRE(dense[i].is_non_overlapping_and_dense());
  }
  GradientTable table(params, {"conv", "linear", "conv_bf16"}, DeviceStatsRecipe::chunk_kernel);
  for (int step = 0; step < 3; ++step) {
    const std::vector<at::Tensor> v = values(step);
    for (size_t i = 0; i < params.size(); ++i) params[i].grad().copy_(v[i]);  // in place, as backward
    table.read_gradients();
    std::vector<double> scalars;
    const GradStats got = table.measure({}, scalars);
    const GradStats want = recipe(v, DeviceStatsRecipe::chunk_kernel);
    BOOST_TEST_CONTEXT("step " << step) {
      check_close(got, want, 0.0);
      BOOST_TEST(got.elements == 64 * 32 * 9 + 63 + 16 * 8 * 25);
      BOOST_TEST(got.sum_squares > 0.0);
    }
  }
  BOOST_TEST(table.plans_made() == 1);  // a copy would be planned again at every step
  const StatsPlan plan = plan_stats_chunks(table.gradients());
  for (size_t i = 0; i < params.size(); ++i) BOOST_TEST(plan.addresses[i] == params[i].grad().data_ptr());

  // Every second column: gaps between the elements, copied (a new copy each step, planned again).
  const at::Tensor wide = at::randint(-8, 9, {40, 20}, at::kFloat);
  const at::Tensor gaps = wide.narrow(1, 0, 20).slice(1, 0, 20, 2);
  BOOST_REQUIRE(!gaps.is_non_overlapping_and_dense());
  const StatsPlan copied = plan_stats_chunks({gaps});
  BOOST_TEST(copied.addresses[0] == nullptr);
  BOOST_TEST(!plan_matches(copied, {gaps}));
  check_close(recipe({gaps}, DeviceStatsRecipe::chunk_kernel),
              recipe({gaps.contiguous()}, DeviceStatsRecipe::fused_scan), 0.0);
}
