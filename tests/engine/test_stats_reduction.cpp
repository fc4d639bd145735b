// The statistics reduced across ranks before the one read (StatsReduction), for each
// recipe on CPU tensors: a stand-in group of two ranks whose other rank holds the same gradients
// (sums double, maxima stay, the scalars' mean is their value) or non-finite ones, and what the
// pass hands it. python/src/group_reduction.cpp is the c10d group; tests/python/test_fsdp.py runs it.
#define BOOST_TEST_MODULE stats_reduction
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "ampkit/gradient_table.h"
#include "ampkit/host_reads.h"

using namespace ampkit;

namespace {

// Two ranks: this one and another whose figures are this rank's, or `other` where given; the
// sums, zeros and elements add up, the max-abs is the larger, the scalars are averaged.
class TwoRanks : public StatsReduction {
 public:
  at::Tensor reduce(const at::Tensor& local) override {
    ++calls;
    seen = local.clone();
    at::Tensor peer = other.defined() ? other : local;
    at::Tensor out = local + peer;
    out[kMaxAbs] = at::maximum(local[kMaxAbs], peer[kMaxAbs]);
    out.narrow(0, kFields, local.numel() - kFields).div_(2.0);
    return out;
  }
  int calls = 0;
  at::Tensor seen;
  at::Tensor other;
};

std::vector<at::Tensor> sample_grads() {
  at::manual_seed(5);
  std::vector<at::Tensor> grads = {at::randn({70000}), at::Tensor(), at::randn({3, 5}), at::zeros({8})};
  grads[0].narrow(0, 100, 50).zero_();
  return grads;
}

GradStats measure(DeviceStatsRecipe recipe, const std::vector<at::Tensor>& grads,
                  const std::vector<at::Tensor>& scalars, std::vector<double>& values,
                  const std::shared_ptr<StatsReduction>& reduction) {
  std::vector<at::Tensor> params;
  for (const auto& g : grads) params.push_back(g.defined() ? at::zeros_like(g) : at::zeros({1}));
  GradientTable table(params, std::vector<std::string>(params.size(), "p"), recipe);
  table.set_reduction(reduction);
  const std::vector<at::Tensor>& read = table.read_gradients();
  BOOST_REQUIRE(read.size() == grads.size());
  for (size_t i = 0; i < grads.size(); ++i) table.replace_gradient(i, grads[i]);
  return table.measure(scalars, values);
}

constexpr DeviceStatsRecipe kRecipes[] = {DeviceStatsRecipe::fused_scan, DeviceStatsRecipe::foreach_ops,
                                          DeviceStatsRecipe::chunk_kernel};

}  // namespace

BOOST_AUTO_TEST_CASE(the_group_totals_replace_the_ranks_in_one_read_and_the_tensor_norms_stay_local) {
  const std::vector<at::Tensor> grads = sample_grads();
  const std::vector<at::Tensor> loss = {at::scalar_tensor(2.5, at::kFloat)};
  for (const DeviceStatsRecipe recipe : kRecipes) {
    BOOST_TEST_CONTEXT(to_string(recipe)) {
      std::vector<double> local_values, values;
      const GradStats local = measure(recipe, grads, loss, local_values, nullptr);
      auto group = std::make_shared<TwoRanks>();
      const int64_t reads = host_reads();
      const GradStats reduced = measure(recipe, grads, loss, values, group);
      BOOST_TEST(host_reads() - reads == 1);  // the pass's one read, the group's figures in it
      BOOST_TEST(group->calls == 1);
      // What the group was given: this rank's totals, then the loss.
      BOOST_REQUIRE(group->seen.numel() == StatsReduction::kFields + 1);
      BOOST_TEST(group->seen[StatsReduction::kSumSquares].item<double>() == local.sum_squares,
                 boost::test_tools::tolerance(1e-12));
      BOOST_TEST(group->seen[StatsReduction::kMaxAbs].item<double>() == local.max_abs);
      BOOST_TEST(group->seen[StatsReduction::kZeros].item<double>() == static_cast<double>(local.zeros));
      BOOST_TEST(group->seen[StatsReduction::kElements].item<double>() ==
                 static_cast<double>(local.elements));
      // What the step reads: the group's.
      BOOST_TEST(reduced.sum_squares == 2 * local.sum_squares, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(reduced.max_abs == local.max_abs);
      BOOST_TEST(reduced.zeros == 2 * local.zeros);
      BOOST_TEST(local.zeros == 58);
      BOOST_TEST(reduced.elements == 2 * local.elements);
      BOOST_TEST(values == std::vector<double>{2.5}, boost::test_tools::per_element());
      BOOST_REQUIRE(reduced.tensor_sum_squares.size() == local.tensor_sum_squares.size());
      for (size_t t = 0; t < local.tensor_sum_squares.size(); ++t)
        BOOST_TEST(reduced.tensor_sum_squares[t] == local.tensor_sum_squares[t]);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_non_finite_figure_on_the_other_rank_is_read_on_this_one) {
  const std::vector<at::Tensor> grads = sample_grads();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const DeviceStatsRecipe recipe : kRecipes) {
    BOOST_TEST_CONTEXT(to_string(recipe)) {
      auto group = std::make_shared<TwoRanks>();
      group->other = at::tensor({inf, inf, 0.0, 10.0, 3.0}, at::kDouble);  // an inf on the other rank
      std::vector<double> values;
      GradStats g = measure(recipe, grads, {at::scalar_tensor(1.0)}, values, group);
      BOOST_TEST(std::isinf(g.sum_squares));
      BOOST_TEST(!g.finite());
      BOOST_TEST(values == std::vector<double>{2.0}, boost::test_tools::per_element());  // (1 + 3) / 2
      group->other = at::tensor({nan, nan, 0.0, 10.0, nan}, at::kDouble);  // a NaN there, and its loss
      g = measure(recipe, grads, {at::scalar_tensor(1.0)}, values, group);
      BOOST_TEST(std::isnan(g.sum_squares));
      BOOST_TEST(std::isnan(g.max_abs));
      BOOST_TEST(std::isnan(values.at(0)));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_without_gradients_still_joins_the_reduction) {
  // Another rank may hold gradients where this one has none (empty shards): the collective must
  // run on every rank, or the others would wait for it.
  for (const DeviceStatsRecipe recipe : kRecipes) {
    BOOST_TEST_CONTEXT(to_string(recipe)) {
      auto group = std::make_shared<TwoRanks>();
      group->other = at::tensor({4.0, 2.0, 1.0, 3.0}, at::kDouble);
      std::vector<double> values;
      const GradStats g = measure(recipe, {at::zeros({0}), at::Tensor()}, {}, values, group);
      BOOST_TEST(group->calls == 1);
      BOOST_TEST(g.sum_squares == 4.0);
      BOOST_TEST(g.max_abs == 2.0);
      BOOST_TEST(g.zeros == 1);
      BOOST_TEST(g.elements == 3);
      BOOST_TEST(values.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(the_deferred_pass_reduces_on_the_device_to_the_figures_the_reading_pass_reads) {
  // GradStatsPass::run_on_device with a reduction (the deferred step): the same vector
  // goes to the group, nothing is read, and the totals left on the device are the ones run() reads,
  // with the group's element count; an inf on the other rank reaches this one's totals.
  const std::vector<at::Tensor> grads = sample_grads();
  const std::vector<at::Tensor> loss = {at::scalar_tensor(2.5, at::kFloat)};
  for (const DeviceStatsRecipe recipe : {DeviceStatsRecipe::fused_scan, DeviceStatsRecipe::chunk_kernel}) {
    BOOST_TEST_CONTEXT(to_string(recipe)) {
      for (const bool other_inf : {false, true}) {
        auto read_group = std::make_shared<TwoRanks>(), device_group = std::make_shared<TwoRanks>();
        if (other_inf) {
          read_group->other = at::tensor({INFINITY, INFINITY, 0.0, 10.0, 3.0}, at::kDouble);
          device_group->other = read_group->other;
        }
        std::vector<double> values;
        const GradStats read = measure(recipe, grads, loss, values, read_group);
        std::vector<at::Tensor> params;
        for (const auto& g : grads) params.push_back(g.defined() ? at::zeros_like(g) : at::zeros({1}));
        GradientTable table(params, std::vector<std::string>(params.size(), "p"), recipe);
        table.set_reduction(device_group);
        (void)table.read_gradients();
        for (size_t i = 0; i < grads.size(); ++i) table.replace_gradient(i, grads[i]);
        const int64_t reads = host_reads();
        const DeviceTotals t = table.measure_on_device(loss);
        BOOST_TEST(host_reads() == reads);  // nothing read
        BOOST_TEST(device_group->calls == 1);
        BOOST_TEST(at::equal(device_group->seen, read_group->seen));  // the same vector given
        const auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
        BOOST_TEST(same(t.sum_squares.item<double>(), read.sum_squares));
        BOOST_TEST(same(t.max_abs.item<double>(), read.max_abs));
        BOOST_TEST(t.zeros.item<double>() == static_cast<double>(read.zeros));
        BOOST_REQUIRE(t.group_elements.defined());
        BOOST_TEST(t.group_elements.item<double>() == static_cast<double>(read.elements));
        BOOST_TEST(t.elements + (other_inf ? 10 : t.elements) == read.elements);  // this rank's count stays
        BOOST_REQUIRE(t.scalars.numel() == 1);
        BOOST_TEST(t.scalars[0].item<double>() == values.at(0));
        BOOST_TEST(std::isinf(t.sum_squares.item<double>()) == other_inf);
      }
    }
  }
}
