// Trainer::step against PyTorch: a healthy step equals scale -> backward -> unscale ->
// clip_grad_norm_ -> SGD, a NaN step changes nothing, accumulated micro-batches equal one large
// batch, and LibTorch's profiler sees the step's ops.
#define BOOST_TEST_MODULE trainer_step
#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "pytorch_reference.h"
#include "tensor_compare.h"
#include "trainer_fixture.h"

using namespace ampkit;
using ampkit::test::batch_x;
using ampkit::test::clone_all;
using ampkit::test::constant_lr;
using ampkit::test::max_rel_error;
using ampkit::test::reference_unscale_and_clip;
using ampkit::test::TinyModel;
using ampkit::test::TinyTrainer;
using Plugins = ampkit::test::BuiltinPlugins;

BOOST_AUTO_TEST_CASE(trainer_step_equals_pytorch_sequence_and_skips_bad_steps) {
  Plugins plugins;
  at::manual_seed(0);
  TinyTrainer run(plugins, {{"scaler", Plugins::choice("static", {{"scale", "1024"}})},
                            {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})}});
  TinyModel reference;
  reference.copy_weights_from(run.model);
  torch::optim::SGD ref_opt(reference.params(), torch::optim::SGDOptions(0.1));

  // A healthy step: compare with scale -> backward -> unscale -> clip_grad_norm_ -> step.
  const StepOutcome ok = run.trainer.step([&](int) { return run.model.loss(batch_x(0)); });
  BOOST_TEST(ok.stepped);
  BOOST_TEST(ok.clip_coefficient < 1.0);
  {
    at::Tensor loss = reference.loss(batch_x(0));
    (loss * 1024.0).backward();
    std::vector<at::Tensor> grads = {reference.layer->weight.grad(), reference.layer->bias.grad()};
    const double norm = reference_unscale_and_clip(grads, 1024.0, 0.05, 2.0);
    BOOST_TEST(std::abs(norm - ok.stats.grad_norm) / norm < 1e-6);
    reference.layer->weight.mutable_grad() = grads[0].to(at::kFloat);
    reference.layer->bias.mutable_grad() = grads[1].to(at::kFloat);
    ref_opt.step();
  }
  BOOST_TEST(max_rel_error(run.model.params(), reference.params()) < 1e-6);

  // A step with a NaN loss: no parameter, optimizer state or learning-rate change.
  const std::vector<at::Tensor> before = clone_all(run.model.params());
  const double lr_before = run.optimizer.param_groups()[0].options().get_lr();
  const StepOutcome bad = run.trainer.step(
      [&](int) { return run.model.loss(batch_x(1)) * std::numeric_limits<float>::quiet_NaN(); });
  BOOST_TEST(!bad.stepped);
  BOOST_TEST(bad.stats.found_inf);
  BOOST_TEST(!bad.stats.loss_finite);
  BOOST_TEST(to_string(bad.decision.action) == std::string("skip"));
  BOOST_TEST(max_rel_error(run.model.params(), before) == 0.0);
  BOOST_TEST(run.optimizer.param_groups()[0].options().get_lr() == lr_before);
  BOOST_TEST(run.trainer.steps_taken() == 1);
  BOOST_TEST(run.trainer.steps_skipped() == 1);
}

BOOST_AUTO_TEST_CASE(accumulated_micro_batches_equal_one_large_batch) {
  Plugins plugins;
  const std::map<std::string, StrategyChoice> scale_4096 = {
      {"scaler", Plugins::choice("static", {{"scale", "4096"}})}};
  at::manual_seed(3);
  TinyTrainer four(plugins, scale_4096, constant_lr(0.5), Precision::fp32, /*accumulation_steps=*/4);
  TinyTrainer one(plugins, scale_4096, constant_lr(0.5), Precision::fp32, /*accumulation_steps=*/1);
  one.model.copy_weights_from(four.model);
  const StepOutcome o4 = four.trainer.step([&](int m) { return four.model.loss(batch_x(m)); });
  const StepOutcome o1 = one.trainer.step([&](int) {
    std::vector<at::Tensor> xs;
    for (int m = 0; m < 4; ++m) xs.push_back(batch_x(m));
    return one.model.loss(at::cat(xs));
  });
  BOOST_TEST(o4.stats.scale == 4096.0);
  BOOST_TEST(std::abs(o4.stats.grad_norm - o1.stats.grad_norm) / o1.stats.grad_norm < 1e-5);
  BOOST_TEST(max_rel_error(four.model.params(), one.model.params()) < 1e-5);
}

// docs/mixed-precision-guide.md's profiling recipe: LibTorch's profiler around Trainer::step
// writes a Chrome trace with the step's ATen ops: forward, autocast's casts, backward, optimizer.
BOOST_AUTO_TEST_CASE(a_step_can_be_profiled_with_libtorchs_profiler) {
  Plugins plugins;
  TinyTrainer run(plugins, {}, constant_lr(0.1), Precision::bf16);
  const std::filesystem::path trace =
      std::filesystem::temp_directory_path() / ("ampkit-step-" + std::to_string(::getpid()) + ".trace.json");
  {
    torch::autograd::profiler::RecordProfile profile(trace.string());
    run.trainer.step([&](int) { return run.model.loss(batch_x(0)); });
  }
  std::ifstream in(trace);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(trace);
  BOOST_TEST(text.find("\"name\": \"aten::addmm\"") != std::string::npos);     // the forward, under autocast
  BOOST_TEST(text.find("\"name\": \"aten::_to_copy\"") != std::string::npos);  // autocast's casts
  BOOST_TEST(text.find("\"name\": \"torch::autograd::AccumulateGrad\"") != std::string::npos);  // backward
  BOOST_TEST(text.find("\"name\": \"aten::add_\"") != std::string::npos);                       // SGD's step
}
