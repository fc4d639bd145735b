// The Trainer's two statistics paths: the device path (one packed statistics pass, one host read
// per healthy step), run here on CPU tensors, steps exactly like the CPU fast path.
#define BOOST_TEST_MODULE stats_paths
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "tensor_compare.h"
#include "trainer_fixture.h"

using namespace ampkit;
using ampkit::test::batch_x;
using ampkit::test::constant_lr;
using ampkit::test::max_rel_error;
using ampkit::test::TinyModel;
using ampkit::test::TinyTrainer;
using Plugins = ampkit::test::BuiltinPlugins;

namespace {

// Two trainers on identical models, data and strategies: one with the CPU's recipe (fused_scan,
// what automatic picks here), one with `recipe`, a GPU's, forced on these CPU tensors.
struct PathPair {
  Plugins plugins;
  TinyTrainer fast, device;

  PathPair(const std::map<std::string, StrategyChoice>& choices, int accumulate, DeviceStatsRecipe recipe)
      : fast(plugins, choices, constant_lr(0.1), Precision::fp32, accumulate),
        device(plugins, choices, constant_lr(0.1), Precision::fp32, accumulate) {
    device.model.copy_weights_from(fast.model);
    BOOST_TEST_REQUIRE((fast.trainer.stats_recipe() == DeviceStatsRecipe::fused_scan));
    device.trainer.set_stats_recipe(recipe);
  }
};

at::Tensor tiny_loss(TinyModel& m, int64_t step, int micro, bool poisoned) {
  const at::Tensor loss = m.loss(batch_x(step * 8 + micro));
  return poisoned ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_path_steps_like_the_fast_path) {
  for (const auto recipe : {DeviceStatsRecipe::foreach_ops, DeviceStatsRecipe::chunk_kernel}) {
    PathPair pair({{"scaler", Plugins::choice("dynamic", {{"init_scale", "1024"}})},
                   {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})}},
                  /*accumulate=*/2, recipe);
    for (int64_t step = 0; step < 6; ++step) {
      const bool poisoned = step == 3;
      const StepOutcome a =
          pair.fast.trainer.step([&](int m) { return tiny_loss(pair.fast.model, step, m, poisoned); });
      const StepOutcome b =
          pair.device.trainer.step([&](int m) { return tiny_loss(pair.device.model, step, m, poisoned); });
      BOOST_TEST_CONTEXT("step " << step) {
        BOOST_TEST(a.stats.found_inf == poisoned);
        BOOST_TEST(b.stats.found_inf == a.stats.found_inf);
        BOOST_TEST(b.stepped == a.stepped);
        BOOST_TEST(b.stats.loss_finite == a.stats.loss_finite);
        if (!poisoned) {
          BOOST_TEST(b.stats.loss == a.stats.loss);  // float64 sums of the same float losses
          BOOST_TEST(std::abs(b.stats.grad_norm - a.stats.grad_norm) <= 1e-6 * a.stats.grad_norm);
          BOOST_TEST(b.stats.grad_max_abs == a.stats.grad_max_abs);
          BOOST_TEST(b.stats.zero_fraction == a.stats.zero_fraction);
          BOOST_TEST(b.stats.grad_elements == a.stats.grad_elements);
          BOOST_TEST(std::abs(b.grad_norm_clipped - a.grad_norm_clipped) <= 1e-6 * a.grad_norm_clipped);
        }
        BOOST_TEST(b.scale_next == a.scale_next);
      }
    }
    BOOST_TEST(max_rel_error(pair.device.model.params(), pair.fast.model.params()) <= 1e-6);
  }
}

// The device path reads the host once per healthy step, whatever the strategies: the
// statistics and the loss come in one copy; the CPU fast path reads the step loss once too.
BOOST_AUTO_TEST_CASE(both_paths_read_the_host_once_per_healthy_step) {
  int combinations = 0;
  for (const std::string scaler : {"none", "static", "dynamic", "predictive"})
    for (const std::string policy : {"skip", "backoff", "abort", "rollback"}) {
      PathPair pair({{"scaler", Plugins::choice(scaler)},
                     {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})},
                     {"nan_policy", Plugins::choice(policy)}},
                    /*accumulate=*/3,
                    combinations % 2 ? DeviceStatsRecipe::chunk_kernel : DeviceStatsRecipe::foreach_ops);
      for (int64_t step = 0; step < 4; ++step) {
        const int64_t before_device = host_reads();
        const StepOutcome b =
            pair.device.trainer.step([&](int m) { return tiny_loss(pair.device.model, step, m, false); });
        const int64_t device_reads = host_reads() - before_device;
        const int64_t before_fast = host_reads();
        pair.fast.trainer.step([&](int m) { return tiny_loss(pair.fast.model, step, m, false); });
        BOOST_TEST_CONTEXT(scaler << " + " << policy << ", step " << step) {
          BOOST_TEST(b.stepped);
          BOOST_TEST(device_reads == 1);
          BOOST_TEST(host_reads() - before_fast == 1);  // the step loss, kept on the device until then
        }
      }
      ++combinations;
    }
  BOOST_TEST(combinations == 16);
}
