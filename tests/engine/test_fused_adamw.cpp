// FusedAdamW: one fused pass per dtype gives LibTorch's AdamW update to rounding, with and without
// amsgrad, and the two optimizers read each other's saved state.
#define BOOST_TEST_MODULE fused_adamw
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ampkit/fused_adamw.h"
#include "tensor_compare.h"

using namespace ampkit;
using ampkit::test::max_rel_error;

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

// Operator names called during one step (every depth), for the launch count of a step.
thread_local std::map<std::string, int>* t_ops = nullptr;

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction& fn) {
  if (t_ops) ++(*t_ops)[fn.name()];
  return nullptr;
}

std::map<std::string, int> ops_of_step(AdamWRun& r, int k) {
  give_grads(r, k);
  std::map<std::string, int> ops;
  t_ops = &ops;
  const auto handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(count_op).scopes({at::RecordScope::FUNCTION}));
  r.optimizer->step();
  at::removeCallback(handle);
  t_ops = nullptr;
  return ops;
}

}  // namespace

// The step counts the kernel reads stay on the parameters' device between steps and
// advance by one _foreach_add_ per kernel call (per dtype here: float and double), not by a new
// tensor per parameter and step; a state whose count changed (a load) gets its count re-made, and
// the update then still equals LibTorch's AdamW at that count.
BOOST_AUTO_TEST_CASE(step_counts_stay_on_the_device_and_advance_in_one_call) {
  AdamWRun fused = adamw_run(true, false), reference = adamw_run(false, false);
  const std::map<std::string, int> first = ops_of_step(fused, 0);
  BOOST_TEST(first.at("aten::scalar_tensor") == 5);  // made once per parameter
  const std::map<std::string, int> second = ops_of_step(fused, 2);
  BOOST_TEST(second.count("aten::scalar_tensor") == 0);
  BOOST_TEST(second.at("aten::_foreach_add_") == 2);  // one per dtype
  BOOST_TEST(second.at("aten::_fused_adamw_") == 2);
  for (int k : {0, 2}) {
    give_grads(reference, k);
    reference.optimizer->step();
  }
  BOOST_TEST(max_rel_error(detached(fused.params), detached(reference.params)) <= 1e-5);
  // A count set from outside (as a loaded checkpoint sets it): both jump to step 101.
  for (AdamWRun* r : {&fused, &reference})
    for (auto& [key, state] : r->optimizer->state())
      static_cast<torch::optim::AdamWParamState&>(*state).step(100);
  const std::map<std::string, int> jumped = ops_of_step(fused, 4);
  BOOST_TEST(jumped.at("aten::scalar_tensor") == 5);
  give_grads(reference, 4);
  reference.optimizer->step();
  BOOST_TEST(max_rel_error(detached(fused.params), detached(reference.params)) <= 1e-5);
}

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

// step_unscaling(s), as the Trainer folds unscale and clip into it: the update of step() on the
// gradients divided by s (float32 and float64 parameters, one without a gradient on odd steps), and
// .grad holds those quotients afterwards. s = 1024 / 0.37: no power of two, so the kernel's division
// and the multiply by float(1 / s) may differ in the last bit.
BOOST_AUTO_TEST_CASE(step_unscaling_equals_step_on_gradients_divided_by_grad_scale) {
  const double grad_scale = 1024.0 / 0.37;
  AdamWRun multiplied = adamw_run(true, false), folded = adamw_run(true, false);
  auto& unscaling = dynamic_cast<UnscalingOptimizer&>(*folded.optimizer);
  double grad_error = 0.0;
  for (int k = 0; k < 30; ++k) {
    give_grads(multiplied, k);
    give_grads(folded, k);
    std::vector<at::Tensor> unscaled;
    for (auto& p : multiplied.params)
      if (p.grad().defined()) unscaled.push_back(p.mutable_grad().mul_(1.0 / grad_scale));
    multiplied.optimizer->step();
    unscaling.step_unscaling(grad_scale);
    std::vector<at::Tensor> after;
    for (auto& p : folded.params)
      if (p.grad().defined()) after.push_back(p.grad());
    grad_error = std::max(grad_error, max_rel_error(after, unscaled));
  }
  const double err = max_rel_error(detached(folded.params), detached(multiplied.params));
  BOOST_TEST_MESSAGE("step_unscaling vs multiply then step, 30 steps: parameters " << err << ", .grad "
                                                                                   << grad_error);
  BOOST_TEST(err < 1e-6);
  BOOST_TEST(grad_error < 1e-6);
  BOOST_TEST(grad_error > 0.0);  // the kernel divided them itself: its own last-bit rounding
}
