// Engine tests: the fused stats + single multiply against PyTorch's unscale-then-clip sequence,
// skipped steps, gradient accumulation and autocast; FusedAdamW against LibTorch's AdamW.
#define BOOST_TEST_MODULE engine
#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "ampkit/fused_adamw.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "tensor_compare.h"

using namespace ampkit;

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

using ampkit::test::max_rel_error;

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

// PyTorch's sequence: GradScaler.unscale_ (the fused non-finite check and unscale), then
// torch.nn.utils.clip_grad_norm_. Run on float64 copies: PyTorch's own fp32 CPU norm is off by
// ~1e-6 relative on 3e5 normal elements and by 1.5e-5 on heavy-tailed ones (measured against a
// float64 sum), so an fp32 reference could not tell a 1e-6 error of ours from its own.
double reference_unscale_and_clip(std::vector<at::Tensor>& grads, double scale, double max_norm,
                                  double norm_type) {
  for (auto& g : grads) g = g.to(at::kDouble);
  at::Tensor found_inf = at::zeros({1});
  at::Tensor inv_scale = at::full({1}, 1.0 / scale);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  std::vector<at::Tensor> params;
  for (auto& g : grads) {
    at::Tensor p = at::zeros_like(g).requires_grad_(true);
    p.mutable_grad() = g;
    params.push_back(p);
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type);
}

using Plugins = test::BuiltinPlugins;

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

namespace {

struct TinyModel {
  torch::nn::Linear layer{torch::nn::LinearOptions(8, 4)};
  std::vector<at::Tensor> params() { return {layer->weight, layer->bias}; }
  std::vector<std::string> names() { return {"weight", "bias"}; }
};

at::Tensor batch_x(int64_t i) {
  at::manual_seed(100 + i);
  return at::randn({16, 8});
}

}  // namespace

BOOST_AUTO_TEST_CASE(trainer_step_equals_pytorch_sequence_and_skips_bad_steps) {
  Plugins plugins;
  auto set = plugins.strategies({{"scaler", Plugins::choice("static", {{"scale", "1024"}})},
                                 {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})}});

  at::manual_seed(0);
  TinyModel model, reference;
  {
    torch::NoGradGuard g;
    reference.layer->weight.copy_(model.layer->weight);
    reference.layer->bias.copy_(model.layer->bias);
  }
  torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(reference.params(), torch::optim::SGDOptions(0.1));
  LrSchedule schedule;
  schedule.base_lr = 0.1;
  Trainer trainer(Precision::fp32, 1, model.params(), model.names(), opt, Plugins::of(*set), schedule);

  // A healthy step: compare with scale -> backward -> unscale -> clip_grad_norm_ -> step.
  const StepOutcome ok = trainer.step([&](int) { return model.layer->forward(batch_x(0)).pow(2).mean(); });
  BOOST_TEST(ok.stepped);
  BOOST_TEST(ok.clip_coefficient < 1.0);
  {
    at::Tensor loss = reference.layer->forward(batch_x(0)).pow(2).mean();
    (loss * 1024.0).backward();
    std::vector<at::Tensor> grads = {reference.layer->weight.grad(), reference.layer->bias.grad()};
    const double norm = reference_unscale_and_clip(grads, 1024.0, 0.05, 2.0);
    BOOST_TEST(std::abs(norm - ok.stats.grad_norm) / norm < 1e-6);
    reference.layer->weight.mutable_grad() = grads[0].to(at::kFloat);
    reference.layer->bias.mutable_grad() = grads[1].to(at::kFloat);
    ref_opt.step();
  }
  BOOST_TEST(max_rel_error(model.params(), reference.params()) < 1e-6);

  // A step with a NaN loss: no parameter, optimizer state or learning-rate change.
  const std::vector<at::Tensor> before = clone_all(model.params());
  const double lr_before = opt.param_groups()[0].options().get_lr();
  const StepOutcome bad = trainer.step([&](int) {
    return model.layer->forward(batch_x(1)).pow(2).mean() * std::numeric_limits<float>::quiet_NaN();
  });
  BOOST_TEST(!bad.stepped);
  BOOST_TEST(bad.stats.found_inf);
  BOOST_TEST(!bad.stats.loss_finite);
  BOOST_TEST(to_string(bad.decision.action) == std::string("skip"));
  BOOST_TEST(max_rel_error(model.params(), before) == 0.0);
  BOOST_TEST(opt.param_groups()[0].options().get_lr() == lr_before);
  BOOST_TEST(trainer.steps_taken() == 1);
  BOOST_TEST(trainer.steps_skipped() == 1);
}

BOOST_AUTO_TEST_CASE(skipped_steps_do_not_advance_the_lr_schedule) {
  Plugins plugins;
  auto set = plugins.strategies();
  TinyModel model;
  torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(1.0));
  LrSchedule schedule;
  schedule.base_lr = 1.0;
  schedule.warmup_steps = 4;  // lr = (taken + 1) / 4
  Trainer trainer(Precision::fp32, 1, model.params(), model.names(), opt, Plugins::of(*set), schedule);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> lrs;
  for (double factor : {1.0, nan, nan, 1.0, nan, 1.0}) {
    const StepOutcome o =
        trainer.step([&](int) { return model.layer->forward(batch_x(2)).pow(2).mean() * factor; });
    lrs.push_back(o.lr);
  }
  const std::vector<double> expected = {0.25, 0.5, 0.5, 0.5, 0.75, 0.75};
  BOOST_TEST(lrs == expected, boost::test_tools::per_element());
  BOOST_TEST(trainer.steps_taken() == 3);
  BOOST_TEST(trainer.steps_skipped() == 3);
}

// The cosine's horizon is in steps taken: 10 attempts with 3 skipped take 7 steps, and the 7th
// ends at the floor (before, the horizon stayed 10 and the run ended at lr 0.345).
BOOST_AUTO_TEST_CASE(cosine_reaches_its_floor_at_the_end_of_a_run_with_skips) {
  Plugins plugins;
  auto set = plugins.strategies();
  TinyModel model;
  torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(1.0));
  LrSchedule schedule;
  schedule.kind = LrSchedule::Kind::cosine;
  schedule.base_lr = 1.0;
  schedule.min_lr = 0.0;
  schedule.total_steps = 10;
  Trainer trainer(Precision::fp32, 1, model.params(), model.names(), opt, Plugins::of(*set), schedule);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> lrs;
  for (double factor : {1.0, nan, 1.0, 1.0, nan, 1.0, 1.0, nan, 1.0, 1.0}) {
    const StepOutcome o =
        trainer.step([&](int) { return model.layer->forward(batch_x(2)).pow(2).mean() * factor; });
    lrs.push_back(o.lr);
  }
  BOOST_TEST(trainer.steps_taken() == 7);
  // lr(k, lost) = 0.5 (1 + cos(pi k / (10 - lost))): k taken before the step, lost before it.
  auto cosine = [](double k, double horizon) { return 0.5 * (1.0 + std::cos(M_PI * k / horizon)); };
  const std::vector<double> expected = {1.0,          cosine(1, 10), cosine(1, 9), cosine(2, 9),
                                        cosine(3, 9), cosine(3, 8),  cosine(4, 8), cosine(5, 8),
                                        cosine(5, 7), cosine(6, 7)};
  BOOST_TEST(lrs == expected, boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
  BOOST_TEST(opt.param_groups()[0].options().get_lr() == 0.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(schedule.at(7, 3) == 0.0);
  BOOST_TEST(schedule.at(7) == cosine(7, 10), boost::test_tools::tolerance(1e-12));  // no loss: as before
}

// docs/mixed-precision-guide.md's profiling recipe: LibTorch's profiler around Trainer::step
// writes a Chrome trace with the step's ATen ops: forward, autocast's casts, backward, optimizer.
BOOST_AUTO_TEST_CASE(a_step_can_be_profiled_with_libtorchs_profiler) {
  Plugins plugins;
  auto set = plugins.strategies();
  TinyModel model;
  torch::optim::SGD opt(model.params(), torch::optim::SGDOptions(0.1));
  LrSchedule schedule;
  schedule.base_lr = 0.1;
  Trainer trainer(Precision::bf16, 1, model.params(), model.names(), opt, Plugins::of(*set), schedule);
  const std::filesystem::path trace =
      std::filesystem::temp_directory_path() / ("ampkit-step-" + std::to_string(::getpid()) + ".trace.json");
  {
    torch::autograd::profiler::RecordProfile profile(trace.string());
    trainer.step([&](int) { return model.layer->forward(batch_x(0)).pow(2).mean(); });
  }
  std::ifstream in(trace);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(trace);
  BOOST_TEST(text.find("\"name\": \"aten::addmm\"") != std::string::npos);     // the forward, under autocast
  BOOST_TEST(text.find("\"name\": \"aten::_to_copy\"") != std::string::npos);  // autocast's casts
  BOOST_TEST(text.find("\"name\": \"torch::autograd::AccumulateGrad\"") != std::string::npos);  // backward
  BOOST_TEST(text.find("\"name\": \"aten::add_\"") != std::string::npos);                       // SGD's step
}

BOOST_AUTO_TEST_CASE(accumulated_micro_batches_equal_one_large_batch) {
  Plugins plugins;
  auto set = plugins.strategies({{"scaler", Plugins::choice("static", {{"scale", "4096"}})}});
  at::manual_seed(3);
  TinyModel a, b;
  {
    torch::NoGradGuard g;
    b.layer->weight.copy_(a.layer->weight);
    b.layer->bias.copy_(a.layer->bias);
  }
  torch::optim::SGD opt_a(a.params(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD opt_b(b.params(), torch::optim::SGDOptions(0.5));
  LrSchedule schedule;
  schedule.base_lr = 0.5;
  Strategies s = Plugins::of(*set);
  Trainer four(Precision::fp32, 4, a.params(), a.names(), opt_a, s, schedule);
  Trainer one(Precision::fp32, 1, b.params(), b.names(), opt_b, s, schedule);
  const StepOutcome o4 = four.step([&](int m) { return a.layer->forward(batch_x(m)).pow(2).mean(); });
  const StepOutcome o1 = one.step([&](int) {
    std::vector<at::Tensor> xs;
    for (int m = 0; m < 4; ++m) xs.push_back(batch_x(m));
    return b.layer->forward(at::cat(xs)).pow(2).mean();
  });
  BOOST_TEST(o4.stats.scale == 4096.0);
  BOOST_TEST(std::abs(o4.stats.grad_norm - o1.stats.grad_norm) / o1.stats.grad_norm < 1e-5);
  BOOST_TEST(max_rel_error(a.params(), b.params()) < 1e-5);
}

BOOST_AUTO_TEST_CASE(autocast_guard_lowers_matmul_precision_only_inside) {
  const at::Tensor x = at::randn({4, 4}), y = at::randn({4, 4});
  {
    AutocastGuard guard(Precision::bf16, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kBFloat16);
  }
  {
    AutocastGuard guard(Precision::fp16, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kHalf);
  }
  {
    AutocastGuard guard(Precision::fp32, at::kCPU);
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
  }
  BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
}

BOOST_AUTO_TEST_CASE(autocast_off_guard_restores_fp32_inside_an_autocast_region) {
  const at::Tensor x = at::randn({64, 64}), y = at::randn({64, 64});
  const at::Tensor exact = at::mm(x, y);
  {
    AutocastGuard on(Precision::bf16, at::kCPU);
    {
      AutocastOffGuard off(at::kCPU);
      const at::Tensor inside = at::mm(x, y);
      BOOST_TEST(inside.scalar_type() == at::kFloat);
      BOOST_TEST(at::equal(inside, exact));  // the same kernel as without any guard
      {
        AutocastGuard nested(Precision::fp16, at::kCPU);  // a region may turn it back on
        BOOST_TEST(at::mm(x, y).scalar_type() == at::kHalf);
      }
      BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
    }
    const at::Tensor after = at::mm(x, y);
    BOOST_TEST(after.scalar_type() == at::kBFloat16);  // the outer region is back
    BOOST_TEST(!at::equal(after.to(at::kFloat), exact));
  }
  {
    AutocastOffGuard off(at::kCPU);  // with autocast already off: changes nothing
    BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
  }
  BOOST_TEST(at::mm(x, y).scalar_type() == at::kFloat);
}

#include "ampkit/device_support.h"

BOOST_AUTO_TEST_CASE(bf16_on_cuda_needs_ampere) {
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {8, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {9, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::fp16, {7, 0}).empty());
  BOOST_TEST(cuda_precision_problem(Precision::bf16, {7, 5}) ==
             "bf16 needs a GPU of compute capability 8.0 (Ampere) or newer; this one is 7.5");
}

BOOST_AUTO_TEST_CASE(reduced_precision_on_a_cpu_without_fast_matmuls_is_noted) {
  const auto cpu = [](std::initializer_list<const char*> flags) {
    CpuCapabilities c;
    c.name = "Test CPU";
    for (const char* f :
         {"avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16", "avx_ne_convert"})
      c.flags[f] = false;
    for (const char* f : flags) c.flags[f] = true;
    return c;
  };
  const CpuCapabilities avx2 = cpu({"avx2"}), avx512 = cpu({"avx2", "avx512_bw", "avx512_vl", "avx512_dq"}),
                        sapphire =
                            cpu({"avx2", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16"}),
                        ne_convert = cpu({"avx2", "avx_ne_convert"}),
                        half_avx512 = cpu({"avx2", "avx512_bw", "avx512_vl"});
  BOOST_TEST(
      cpu_precision_note(Precision::bf16, avx2) ==
      "note: this CPU (Test CPU) has no AVX-512 or AVX-NE-CONVERT, so LibTorch runs bf16 matmuls without "
      "oneDNN, some over 100x slower than fp32: a step on CPU usually takes several times as long as in "
      "fp32 (docs/benchmarks.md)");
  BOOST_TEST(cpu_precision_note(Precision::fp16, avx2)
                 .find("has no AVX512-FP16 or AVX-NE-CONVERT, so LibTorch runs fp16 matmuls") !=
             std::string::npos);
  BOOST_TEST(!cpu_precision_note(Precision::bf16, half_avx512).empty());  // oneDNN needs all three
  BOOST_TEST(cpu_precision_note(Precision::bf16, avx512).empty());
  BOOST_TEST(!cpu_precision_note(Precision::fp16, avx512).empty());
  BOOST_TEST(cpu_precision_note(Precision::fp16, sapphire).empty());
  BOOST_TEST(cpu_precision_note(Precision::bf16, ne_convert).empty());
  BOOST_TEST(cpu_precision_note(Precision::fp16, ne_convert).empty());
  for (const auto& c : {avx2, avx512, CpuCapabilities{}})
    BOOST_TEST(cpu_precision_note(Precision::fp32, c).empty());
  // LibTorch reports this machine's flags under the names the decision reads.
  const CpuCapabilities here = cpu_capabilities();
  for (const char* f : {"avx512_bw", "avx512_vl", "avx512_dq", "avx512_fp16", "amx_fp16", "avx_ne_convert"})
    BOOST_TEST(here.flags.count(f) == 1u, f);
}

namespace {

// Parameters of several shapes (one without a gradient in some steps) and their gradients.
struct AdamWRun {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

AdamWRun adamw_run(bool fused, bool amsgrad) {
  at::manual_seed(11);
  AdamWRun r;
  // The last parameter is double: the fused kernel is called once per dtype.
  for (const auto& s : std::vector<std::vector<int64_t>>{{7}, {64, 33}, {1}, {200003}, {3, 5, 7}})
    r.params.push_back(at::randn(s, s.size() == 3 ? at::kDouble : at::kFloat).requires_grad_(true));
  const auto options = torch::optim::AdamWOptions(3e-3).weight_decay(0.05).amsgrad(amsgrad);
  if (fused)
    r.optimizer = std::make_unique<FusedAdamW>(r.params, options);
  else
    r.optimizer = std::make_unique<torch::optim::AdamW>(r.params, options);
  return r;
}

// The same gradients for step k in both runs; parameter 2 gets none on odd steps.
void give_grads(AdamWRun& r, int k) {
  at::manual_seed(100 + k);
  for (size_t i = 0; i < r.params.size(); ++i) {
    const at::ScalarType dtype = r.params[i].scalar_type();
    at::Tensor g = at::randn(r.params[i].sizes(), dtype) * at::exp(at::randn(r.params[i].sizes(), dtype));
    r.params[i].mutable_grad() = (i == 2 && k % 2) ? at::Tensor() : g;
  }
}

std::vector<at::Tensor> detached(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.detach().clone());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fused_adamw_follows_libtorch_adamw_and_shares_its_checkpoints) {
  for (const bool amsgrad : {false, true}) {
    AdamWRun ref = adamw_run(false, amsgrad), fused = adamw_run(true, amsgrad);
    for (int k = 0; k < 30; ++k) {
      give_grads(ref, k);
      give_grads(fused, k);
      ref.optimizer->step();
      fused.optimizer->step();
      if (k == 14) {  // half way the learning rate changes, as the schedule changes it
        for (auto* o : {ref.optimizer.get(), fused.optimizer.get()})
          static_cast<torch::optim::AdamWOptions&>(o->param_groups()[0].options()).lr(1e-3);
      }
    }
    // One fused pass against nine separate elementwise ops: the same update to rounding.
    const double err = max_rel_error(detached(fused.params), detached(ref.params));
    BOOST_TEST_MESSAGE("FusedAdamW vs torch::optim::AdamW, 30 steps, amsgrad " << amsgrad << ": " << err);
    BOOST_TEST(err < 1e-6);
    BOOST_TEST(err > 0.0);  // the fused kernel really ran (the two differ in the last bits)
    for (size_t i = 0; i < ref.params.size(); ++i) {
      const auto& a = static_cast<torch::optim::AdamWParamState&>(
          *ref.optimizer->state().at(ref.params[i].unsafeGetTensorImpl()));
      const auto& b = static_cast<torch::optim::AdamWParamState&>(
          *fused.optimizer->state().at(fused.params[i].unsafeGetTensorImpl()));
      BOOST_TEST(a.step() == b.step());
      BOOST_TEST(max_rel_error({b.exp_avg_sq()}, {a.exp_avg_sq()}) < 1e-5);
    }
    BOOST_TEST(static_cast<torch::optim::AdamWParamState&>(
                   *fused.optimizer->state().at(fused.params[2].unsafeGetTensorImpl()))
                   .step() == 15);  // stepped only with a gradient
  }

  // A state saved by torch::optim::AdamW continues in FusedAdamW (older checkpoints) and the
  // reverse: both continuations match the unbroken run to rounding.
  AdamWRun unbroken = adamw_run(false, false), first = adamw_run(false, false);
  for (int k = 0; k < 10; ++k) {
    give_grads(unbroken, k);
    unbroken.optimizer->step();
    give_grads(first, k);
    first.optimizer->step();
  }
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    first.optimizer->save(archive);
    archive.save_to(saved);
  }
  AdamWRun second = adamw_run(true, false);
  for (size_t i = 0; i < second.params.size(); ++i) {
    at::NoGradGuard no_grad;
    second.params[i].copy_(first.params[i]);
  }
  {
    torch::serialize::InputArchive archive;
    archive.load_from(saved);
    second.optimizer->load(archive);
  }
  for (int k = 10; k < 20; ++k) {
    give_grads(unbroken, k);
    unbroken.optimizer->step();
    give_grads(second, k);
    second.optimizer->step();
  }
  BOOST_TEST(max_rel_error(detached(second.params), detached(unbroken.params)) < 1e-6);
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

namespace {

// Two trainers on identical models, data and strategies; one on each statistics path.
struct PathPair {
  Plugins plugins;
  std::unique_ptr<StrategySet> set_fast, set_device;
  TinyModel fast_model, device_model;
  std::unique_ptr<torch::optim::SGD> opt_fast, opt_device;
  std::unique_ptr<Trainer> fast, device;

  PathPair(const std::map<std::string, StrategyChoice>& choices, int accumulate) {
    set_fast = plugins.strategies(choices);
    set_device = plugins.strategies(choices);
    {
      torch::NoGradGuard g;
      device_model.layer->weight.copy_(fast_model.layer->weight);
      device_model.layer->bias.copy_(fast_model.layer->bias);
    }
    opt_fast = std::make_unique<torch::optim::SGD>(fast_model.params(), torch::optim::SGDOptions(0.1));
    opt_device = std::make_unique<torch::optim::SGD>(device_model.params(), torch::optim::SGDOptions(0.1));
    LrSchedule schedule;
    schedule.base_lr = 0.1;
    fast = std::make_unique<Trainer>(Precision::fp32, accumulate, fast_model.params(), fast_model.names(),
                                     *opt_fast, Plugins::of(*set_fast), schedule);
    device = std::make_unique<Trainer>(Precision::fp32, accumulate, device_model.params(),
                                       device_model.names(), *opt_device, Plugins::of(*set_device), schedule);
    fast->set_stats_path(Trainer::StatsPath::cpu_fast);
    device->set_stats_path(Trainer::StatsPath::device);
  }
};

at::Tensor tiny_loss(TinyModel& m, int64_t step, int micro, bool poisoned) {
  const at::Tensor loss = m.layer->forward(batch_x(step * 8 + micro)).pow(2).mean();
  return poisoned ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_path_steps_like_the_fast_path) {
  PathPair pair({{"scaler", Plugins::choice("dynamic", {{"init_scale", "1024"}})},
                 {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})}},
                /*accumulate=*/2);
  for (int64_t step = 0; step < 6; ++step) {
    const bool poisoned = step == 3;
    const StepOutcome a =
        pair.fast->step([&](int m) { return tiny_loss(pair.fast_model, step, m, poisoned); });
    const StepOutcome b =
        pair.device->step([&](int m) { return tiny_loss(pair.device_model, step, m, poisoned); });
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
  BOOST_TEST(max_rel_error(pair.device_model.params(), pair.fast_model.params()) <= 1e-6);
}

// The device path reads the host once per healthy step, whatever the strategies: the
// statistics and the loss come in one copy; the CPU fast path reads each micro-batch's loss.
BOOST_AUTO_TEST_CASE(device_path_reads_the_host_once_per_healthy_step) {
  int combinations = 0;
  for (const std::string scaler : {"none", "static", "dynamic", "predictive"})
    for (const std::string policy : {"skip", "backoff", "abort", "rollback"}) {
      PathPair pair({{"scaler", Plugins::choice(scaler)},
                     {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})},
                     {"nan_policy", Plugins::choice(policy)}},
                    /*accumulate=*/3);
      for (int64_t step = 0; step < 4; ++step) {
        const int64_t before_device = host_reads();
        const StepOutcome b =
            pair.device->step([&](int m) { return tiny_loss(pair.device_model, step, m, false); });
        const int64_t device_reads = host_reads() - before_device;
        const int64_t before_fast = host_reads();
        pair.fast->step([&](int m) { return tiny_loss(pair.fast_model, step, m, false); });
        BOOST_TEST_CONTEXT(scaler << " + " << policy << ", step " << step) {
          BOOST_TEST(b.stepped);
          BOOST_TEST(device_reads == 1);
          BOOST_TEST(host_reads() - before_fast == 3);  // one loss per micro-batch
        }
      }
      ++combinations;
    }
  BOOST_TEST(combinations == 16);
}
