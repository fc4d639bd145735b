// The checks of tools/gpu-check.sh on the device AMPKIT_TEST_DEVICE names: "cpu" (the
// default; the device statistics path forced on CPU tensors, so CI runs every check) or "cuda"
// (the real device path; exits 77, which ctest reports as skipped, when no GPU is visible):
//   - GradScaler parity through the Trainer: tests/data/gradscaler_sequences.json, or the file in
//     AMPKIT_GRADSCALER_GOLDENS (gpu-check.sh writes one with torch.amp.GradScaler("cuda"));
//   - the clippers on the device through the Trainer against tests/data/clipper_goldens.json;
//   - exactly one counted host read per healthy step for the 16 scaler x NaN-policy pairs;
//   - the data-parallel step's values carried in the gradient buckets, bit for bit;
//   - the statistics kernel (the chunk_kernel recipe) against the foreach recipe.
#define BOOST_TEST_MODULE on_device
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ampkit/device_step.h"
#include "ampkit/grad_stats.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/host_reads.h"
#include "ampkit/step_values_carrier.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "recording_sgd.h"
#include "tensor_compare.h"
#include "test_paths.h"

using namespace ampkit;
using nlohmann::json;
using Plugins = ampkit::test::BuiltinPlugins;

namespace {

std::string device_name() {
  const char* v = std::getenv("AMPKIT_TEST_DEVICE");
  return v && *v ? v : "cpu";
}

at::Device test_device() {
  return device_name() == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

// Before any test: an unknown device fails, a missing GPU skips the whole binary (exit 77).
struct DeviceCheck {
  DeviceCheck() {
    const std::string d = device_name();
    if (d != "cpu" && d != "cuda") {
      std::printf("AMPKIT_TEST_DEVICE must be cpu or cuda, not '%s'\n", d.c_str());
      std::exit(2);
    }
    if (d == "cuda" && !torch::cuda::is_available()) {
      std::printf("skipped: AMPKIT_TEST_DEVICE=cuda but LibTorch sees no CUDA device\n");
      std::fflush(stdout);
      std::exit(77);
    }
    std::printf("device: %s\n", d.c_str());
  }
};
BOOST_TEST_GLOBAL_FIXTURE(DeviceCheck);

// The device path on every device: automatic on CUDA (asserted: the chunk kernel where this build
// holds it, foreach_ops otherwise), forced on CPU tensors with the recipe a GPU runs.
void use_device_path(Trainer& trainer) {
  if (test_device().is_cpu())
    trainer.set_stats_recipe(chunk_kernel_built() ? DeviceStatsRecipe::chunk_kernel
                                                  : DeviceStatsRecipe::foreach_ops);
  else
    BOOST_TEST_REQUIRE((trainer.stats_recipe() == (chunk_kernel_built() ? DeviceStatsRecipe::chunk_kernel
                                                                        : DeviceStatsRecipe::foreach_ops)));
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return json::parse(in);
}

std::string text(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

using ampkit::test::RecordingSGD;

}  // namespace

// GradScaler's loss-scale sequences, with the overflow made where GradScaler's was: an inf written
// into a gradient after backward (a tensor hook), the loss finite. The Trainer finds it on the
// device, skips the step and updates the dynamic scaler; every scale and growth tracker must equal
// the reference's.
BOOST_AUTO_TEST_CASE(gradscaler_sequences_through_the_trainer) {
  const char* override_path = std::getenv("AMPKIT_GRADSCALER_GOLDENS");
  const std::string path = override_path && *override_path ? override_path
                                                           : std::string(ampkit::test::source_dir()) +
                                                                 "/tests/data/gradscaler_sequences.json";
  const json g = read_json(path);
  BOOST_TEST_MESSAGE("reference: " << g.at("reference").get<std::string>());
  Plugins plugins;
  size_t steps_checked = 0;
  for (const auto& p : g.at("patterns")) {
    std::map<std::string, std::string> options;
    for (const auto& [k, v] : p.at("options").items())
      options[k] = v.is_number_integer() ? std::to_string(v.get<int64_t>()) : text(v.get<double>());
    for (const auto& [k, v] : p.at("ampkit_options").items()) options[k] = text(v.get<double>());
    auto set = plugins.strategies({{"scaler", Plugins::choice("dynamic", options)}});
    at::Tensor param = at::ones({4}, at::TensorOptions(test_device())).requires_grad_(true);
    bool overflow = false;
    param.register_hook([&overflow](const at::Tensor& grad) -> at::Tensor {
      if (!overflow) return grad;
      at::Tensor bad = grad.clone();
      bad[1] = std::numeric_limits<float>::infinity();
      return bad;
    });
    torch::optim::SGD opt({param}, torch::optim::SGDOptions(0.0));  // only the scaler matters
    Trainer trainer(Precision::fp32, 1, {param}, {"p"}, opt, Plugins::of(*set), LrSchedule{});
    use_device_path(trainer);
    const auto& found = p.at("found_inf");
    const size_t steps = p.at("steps").get<size_t>();
    size_t t = 0;
    for (; t < steps; ++t) {
      overflow = found[t].get<int>() != 0;
      const StepOutcome out = trainer.step([&](int) { return (param * 0.0).sum(); });
      const bool ok =
          out.stats.scale == p.at("scale")[t].get<double>() &&
          out.scale_next == p.at("scale_next")[t].get<double>() &&
          set->scaler().save().get<int64_t>("growth_tracker") == p.at("growth_tracker")[t].get<int64_t>() &&
          out.stats.found_inf == overflow && out.stepped == !overflow;
      if (!ok) {
        BOOST_TEST_CONTEXT("pattern " << p.at("name").get<std::string>() << ", step " << t) {
          BOOST_TEST(out.stats.scale == p.at("scale")[t].get<double>());
          BOOST_TEST(out.scale_next == p.at("scale_next")[t].get<double>());
          BOOST_TEST(out.stats.found_inf == overflow);
          BOOST_TEST(out.stepped == !overflow);
        }
        break;
      }
    }
    BOOST_TEST(t == steps);
    steps_checked += t;
  }
  BOOST_TEST(steps_checked == 4100u + 24 + 40 + 200 + 14 + 8 + 6 + 60 + 80 + 30);
}

namespace {

// The clipper goldens' parameters on the device, and a loss sum_i <p_i, G_i> whose gradient is
// exactly G_i; a static scale of 65536 (a power of two) makes the scaled backward exact too.
struct GoldenStep {
  json g = read_json(std::string(ampkit::test::source_dir()) + "/tests/data/clipper_goldens.json");

  std::vector<at::Tensor> tensors(const json& lists, at::ScalarType dtype, at::Device device) const {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < g["shapes"].size(); ++i)
      out.push_back(at::tensor(lists[i].get<std::vector<double>>(), at::kDouble)
                        .reshape(g["shapes"][i].get<std::vector<int64_t>>())
                        .to(device, dtype));
    return out;
  }

  // One Trainer step with `clipper`: the gradients the optimizer got, on the host, in float64.
  std::vector<at::Tensor> run(Plugins& plugins, const std::string& clipper,
                              const std::map<std::string, std::string>& options, StepOutcome& out) const {
    auto set = plugins.strategies({{"scaler", Plugins::choice("static", {{"scale", "65536"}})},
                                   {"clipper", Plugins::choice(clipper, options)}});
    std::vector<at::Tensor> params = tensors(g["params"], at::kFloat, test_device());
    for (auto& p : params) p.requires_grad_(true);
    const std::vector<at::Tensor> grads = tensors(g["grads"], at::kFloat, test_device());
    std::vector<std::string> names;
    for (size_t i = 0; i < params.size(); ++i) names.push_back("p" + std::to_string(i));
    RecordingSGD opt(params, torch::optim::SGDOptions(1.0));
    LrSchedule schedule;
    schedule.base_lr = 1.0;
    Trainer trainer(Precision::fp32, 1, params, names, opt, Plugins::of(*set), schedule);
    use_device_path(trainer);
    out = trainer.step([&](int) {
      at::Tensor loss = at::zeros({}, at::TensorOptions(test_device()));
      for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * grads[i]).sum();
      return loss;
    });
    return opt.seen;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(clippers_on_the_device_equal_their_references) {
  Plugins plugins;
  const GoldenStep golden;
  const json& g = golden.g;
  struct Case {
    std::string clipper;
    std::map<std::string, std::string> options;
    const json& expected;
  };
  const std::vector<Case> cases = {
      {"norm", {{"max_norm", text(g["norm"][0]["max_norm"])}, {"norm_type", "2"}}, g["norm"][0]},
      {"norm", {{"max_norm", text(g["norm"][2]["max_norm"])}, {"norm_type", "inf"}}, g["norm"][2]},
      {"value", {{"clip_value", text(g["value"][0]["clip_value"])}}, g["value"][0]},
      {"agc",
       {{"clip_factor", text(g["agc"][0]["clip_factor"])}, {"eps", text(g["agc"][0]["eps"])}},
       g["agc"][0]},
  };
  const double golden_norm = g["norm"][0]["total_norm"];
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.clipper << " " << c.options.begin()->first << "=" << c.options.begin()->second) {
      StepOutcome out;
      const std::vector<at::Tensor> seen = golden.run(plugins, c.clipper, c.options, out);
      const std::vector<at::Tensor> expected = golden.tensors(c.expected["grads"], at::kDouble, at::kCPU);
      BOOST_TEST(out.stepped);
      BOOST_TEST(std::abs(out.stats.grad_norm - golden_norm) <= 1e-6 * golden_norm);
      BOOST_TEST(out.clip_coefficient < 1.0);
      const double error = ampkit::test::max_rel_error(seen, expected);
      BOOST_TEST_MESSAGE(c.clipper << ": gradients' max relative error " << error);
      BOOST_TEST(error <= 1e-6);
    }
  }
}

namespace {

struct Tiny {
  torch::nn::Linear layer{torch::nn::LinearOptions(8, 4)};
  Tiny() { layer->to(test_device()); }
  std::vector<at::Tensor> params() { return {layer->weight, layer->bias}; }
};

}  // namespace

// The device path reads the host once per healthy step, whatever the scaler and NaN policy (the
// statistics and the loss come in one copy), with a norm clipper active.
BOOST_AUTO_TEST_CASE(one_counted_host_read_per_healthy_step) {
  Plugins plugins;
  int combinations = 0;
  for (const std::string scaler : {"none", "static", "dynamic", "predictive"})
    for (const std::string policy : {"skip", "backoff", "abort", "rollback"}) {
      auto set = plugins.strategies({{"scaler", Plugins::choice(scaler)},
                                     {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})},
                                     {"nan_policy", Plugins::choice(policy)}});
      at::manual_seed(0);
      Tiny model;
      torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(0.1));
      LrSchedule schedule;
      schedule.base_lr = 0.1;
      Trainer trainer(Precision::fp32, 3, model.params(), {"weight", "bias"}, opt, Plugins::of(*set),
                      schedule);
      use_device_path(trainer);
      for (int64_t step = 0; step < 4; ++step) {
        const int64_t before = host_reads();
        const StepOutcome out = trainer.step([&](int micro) {
          at::manual_seed(100 + step * 8 + micro);
          return model.layer->forward(at::randn({16, 8}).to(test_device())).pow(2).mean();
        });
        BOOST_TEST_CONTEXT(scaler << " + " << policy << ", step " << step) {
          BOOST_TEST(out.stepped);
          BOOST_TEST(host_reads() - before == 1);
        }
      }
      ++combinations;
    }
  BOOST_TEST(combinations == 16);
}

// The step's values carried in the gradient buckets (StepValuesCarrier) on the device: the
// encoding runs there, and three ranks' pieces, multiplied by 1 / 3 in fp32 and summed as the
// Reducer's buckets are, decode to the same bits. (tests/engine/test_step_values_carrier has the
// special values and other world sizes on CPU tensors.)
BOOST_AUTO_TEST_CASE(step_values_ride_the_buckets_bit_for_bit) {
  const std::vector<double> rows = {0.1, -2.5e-8, std::numeric_limits<double>::infinity(), 7.0, 1e300, -0.0};
  at::Tensor bucket;
  for (int r = 0; r < 3; ++r) {
    StepValuesCarrier carrier(3, r, at::TensorOptions(test_device()));
    const at::Tensor w = at::ones({2}, at::TensorOptions(test_device())).requires_grad_(true);
    const std::vector<double> row(rows.begin() + 2 * r, rows.begin() + 2 * r + 2);
    carrier.attach(w.sum(), at::tensor(row, at::kDouble).to(test_device())).backward();
    BOOST_TEST(w.grad().cpu().equal(at::ones({2})));
    const at::Tensor divided = at::mul(carrier.gathered(), 1.0 / 3);
    bucket = bucket.defined() ? bucket + divided : divided;
  }
  const at::Tensor read = bucket.to(at::kDouble).cpu().contiguous();
  const std::vector<double> got =
      StepValuesCarrier(3, 0, at::TensorOptions(test_device()))
          .decode({read.data_ptr<double>(), read.data_ptr<double>() + read.numel()}, 2);
  BOOST_REQUIRE(got.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i) BOOST_TEST(std::signbit(got[i]) == std::signbit(rows[i]));
  BOOST_TEST(got == rows, boost::test_tools::per_element());
}

// The chunk_kernel recipe (one read per element, ampkit's own CUDA kernel) against the foreach
// recipe on the same gradients: float, half and bfloat16, chunk boundaries crossed, exact zeros,
// then an infinity and a NaN; one counted read each. On CPU tensors the chunks are computed on
// the host (tests/engine/test_stats_chunk_kernel has the details).
BOOST_AUTO_TEST_CASE(the_statistics_kernel_agrees_with_the_foreach_recipe) {
  // The kernel sums squares in float64; CUDA's _foreach_norm accumulates in float through a
  // tree of partial sums, within about log2(n) roundings of float (1e-6 over these 196,619
  // elements); max-abs and the counts are exact on both.
  const double kSquaresTolerance = test_device().is_cpu() ? 1e-9 : 1e-5;
  if (!test_device().is_cpu())
    BOOST_TEST_REQUIRE(chunk_kernel_built(), "this build has no statistics kernel");
  at::manual_seed(11);
  std::vector<at::Tensor> grads;
  for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    at::Tensor big = at::randn({65536 * 3 + 11}) * 100;
    big.narrow(0, 65000, 2000).zero_();
    grads.push_back(big.to(test_device(), dtype));
    grads.push_back(at::randn({7, 5}).to(test_device(), dtype));
  }
  auto both = [&](const char* when) {
    std::vector<double> values;
    const int64_t before = host_reads();
    const GradStats k = compute_grad_stats_on_device(grads, {}, values, DeviceStatsRecipe::chunk_kernel);
    BOOST_TEST(host_reads() - before == 1, when);
    const GradStats f = compute_grad_stats_on_device(grads, {}, values, DeviceStatsRecipe::foreach_ops);
    BOOST_TEST_CONTEXT(when) {
      if (std::isfinite(f.sum_squares))
        BOOST_TEST(k.sum_squares == f.sum_squares, boost::test_tools::tolerance(kSquaresTolerance));
      else
        BOOST_TEST(std::isnan(k.sum_squares) == std::isnan(f.sum_squares));
      BOOST_TEST((k.max_abs == f.max_abs || (std::isnan(k.max_abs) && std::isnan(f.max_abs))));
      BOOST_TEST(k.zeros == f.zeros);
      BOOST_TEST(k.elements == f.elements);
      for (size_t t = 0; t < grads.size(); ++t)
        if (std::isfinite(f.tensor_sum_squares[t]))
          BOOST_TEST(k.tensor_sum_squares[t] == f.tensor_sum_squares[t],
                     boost::test_tools::tolerance(kSquaresTolerance));
    }
    return k;
  };
  BOOST_TEST(both("finite").zeros >= 3 * 2000);
  grads[2].view({-1})[65536 + 5] = std::numeric_limits<float>::infinity();
  BOOST_TEST(std::isinf(both("an infinity").max_abs));
  grads[4].view({-1})[131072 + 9] = std::numeric_limits<float>::quiet_NaN();
  BOOST_TEST(std::isnan(both("a NaN").max_abs));
}

// The deferred step's rules as one kernel (core/engine/src/cuda/step_rules_abi.h): on a GPU the
// kernel must decide what the same function decides on the host for CPU tensors (which
// test_device_step holds to the host forms bit for bit), step after step from the same totals:
// overflows, NaN, non-finite losses, a streak, clipping both ways, hysteresis and growth.
BOOST_AUTO_TEST_CASE(the_rules_kernel_decides_as_the_host_function_bit_for_bit) {
  if (!test_device().is_cpu())
    BOOST_TEST_REQUIRE(DeviceStepRules::runs_on(test_device()), "this build has no rules kernel");
  Plugins plugins;
  auto set = plugins.strategies(
      {{"scaler",
        Plugins::choice("dynamic", {{"init_scale", "65536"}, {"growth_interval", "5"}, {"hysteresis", "2"}})},
       {"clipper", Plugins::choice("norm", {{"max_norm", "20"}})},
       {"nan_policy", Plugins::choice("backoff", {{"max_consecutive", "9"}})}});
  std::string missing;
  auto here = DeviceStepRules::of(set->scaler(), set->clipper(), set->nan_policy(), missing);
  auto there = DeviceStepRules::of(set->scaler(), set->clipper(), set->nan_policy(), missing);
  BOOST_REQUIRE(here && there);
  here->start(set->scaler(), at::kCPU, 0);
  there->start(set->scaler(), test_device(), 0);
  at::Tensor scale_here = here->scale().clone(), scale_there = there->scale().clone();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  int skipped = 0, clipped = 0;
  for (int i = 0; i < 200; ++i) {
    const double size = std::exp(0.05 * (i % 97));  // across the threshold, times the scale below
    const double scaled = size * static_cast<double>(scale_here.item<float>());  // the gradients are scaled
    double sum = scaled * scaled, max_abs = scaled, loss = 2.0;
    if (i % 17 == 3) sum = inf, max_abs = inf;
    if (i % 29 == 7) sum = nan, max_abs = nan;
    if (i % 31 == 11) loss = nan;
    if (i >= 120 && i < 124) sum = inf;  // a streak
    const std::vector<double> in = {sum, max_abs, 3.0, loss};
    const at::Tensor cpu = at::tensor(in, f64), device = cpu.to(test_device());
    const DeviceStepResult a = here->step({cpu[0], cpu[1], cpu[2], cpu[3], at::Tensor()}, scale_here);
    const DeviceStepResult b =
        there->step({device[0], device[1], device[2], device[3], at::Tensor()}, scale_there);
    const at::Tensor ra = a.record, rb = b.record.cpu();
    BOOST_TEST_CONTEXT("step " << i) {
      BOOST_REQUIRE(ra.numel() == rb.numel());
      for (int64_t k = 0; k < ra.numel(); ++k) {
        const double x = ra[k].item<double>(), y = rb[k].item<double>();
        BOOST_TEST((x == y || (std::isnan(x) && std::isnan(y))),
                   "record field " << k << ": " << x << " vs " << y);
      }
      BOOST_TEST(a.grad_scale.item<float>() == b.grad_scale.cpu().item<float>());
      BOOST_TEST(a.found_inf.item<float>() == b.found_inf.cpu().item<float>());
      BOOST_TEST(a.stepped.item<bool>() == b.stepped.cpu().item<bool>());
      BOOST_TEST(scale_here.item<float>() == scale_there.cpu().item<float>());
    }
    skipped += a.stepped.item<bool>() ? 0 : 1;
    clipped += ra[3].item<double>() < 1.0 ? 1 : 0;
    if (ra[2].item<double>() > 0) break;
  }
  BOOST_TEST(skipped > 10);
  BOOST_TEST(clipped > 10);
}
