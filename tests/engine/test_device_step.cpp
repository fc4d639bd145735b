// The strategies' device forms against their host forms: the built-in scalers (dynamic
// with hysteresis, bounds and its stop at min_scale; static; none), clippers (norm L2 and inf;
// none) and NaN policies (skip with a streak limit, backoff, abort) run 300 steps through the
// engine's host step (AmpStep) and through DeviceStepRules on CPU tensors (the function a GPU runs
// as its rules kernel), from the same totals: planted overflows, non-finite losses, gradient-norm
// spikes that clip. Every decision,
// clip coefficient and scale must be the same, bit for bit. And the Trainer's deferred step
// against its synchronous one.
#define BOOST_TEST_MODULE device_step
#include <ATen/ATen.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ampkit/amp_step.h"
#include "ampkit/deferred_step.h"
#include "ampkit/device_step.h"
#include "ampkit/fused_adamw.h"
#include "ampkit/gradient_table.h"
#include "ampkit/host_reads.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "fused_run.h"
#include "trainer_fixture.h"

using namespace ampkit;
using Plugins = ampkit::test::BuiltinPlugins;

namespace {

using Options = std::map<std::string, std::string>;

// What one step plants: a gradient (scaled) of this size, and whether the loss is finite.
struct Planted {
  double grad = 1.0;  // inf or NaN: an overflow
  double loss = 2.0;  // NaN: a non-finite loss
};

std::vector<Planted> schedule(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<Planted> steps(300);
  for (size_t i = 0; i < steps.size(); ++i) {
    const double r = u(rng);
    steps[i].grad = std::exp(8.0 * u(rng));  // norms across both sides of the clip thresholds
    if (r < 0.08) steps[i].grad = std::numeric_limits<double>::infinity();
    if (r >= 0.08 && r < 0.10) steps[i].grad = std::nan("");
    if (r >= 0.10 && r < 0.12) steps[i].loss = std::nan("");
    if (i >= 150 && i < 156) steps[i].grad = std::numeric_limits<double>::infinity();  // a streak
  }
  return steps;
}

uint64_t bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Runs both forms over `steps`; returns the steps run (up to an abort) and how many were bad, and
// the host form's scale after each step in `scales` where given.
int compare(Plugins& plugins, const std::map<std::string, StrategyChoice>& choices, int& skipped,
            const std::vector<Planted>& steps = schedule(11), std::vector<double>* scales = nullptr) {
  auto set = plugins.strategies(choices);
  AmpStep host({&set->scaler(), &set->clipper(), &set->nan_policy()});
  std::string missing;
  // The rules (cuda/step_rules_abi.h, what a GPU runs as one kernel), from the totals the deferred
  // step measures, with their own state and scale.
  auto rules = DeviceStepRules::of(set->scaler(), set->clipper(), set->nan_policy(), missing);
  BOOST_REQUIRE_MESSAGE(rules, "no device rule from the " << missing);
  rules->start(set->scaler(), at::kCPU, 0);
  at::Tensor device_scale = rules->scale().clone();
  at::Tensor weight = at::zeros({1}).set_requires_grad(true);
  GradientTable table({weight}, {"w"});
  host.start(RunInfo{});
  int run = 0;
  skipped = 0;
  for (const Planted& p : steps) {
    StepOutcome out = host.begin_iteration();
    weight.mutable_grad() = at::full({1}, p.grad * out.stats.scale, at::kFloat);
    table.read_gradients();
    out.stats.loss = p.loss;
    host.after_backward({table, /*fold=*/true, SkippedGradients::keep, at::Tensor(), nullptr}, out);
    const StepOutcome done = host.finish_iteration();
    const DeviceTotals totals = table.measure_on_device({});
    const DeviceStepResult f = rules->step({totals.sum_squares, totals.max_abs, totals.zeros,
                                            at::scalar_tensor(p.loss, at::kDouble), at::Tensor()},
                                           device_scale);
    const at::Tensor r = f.record;
    BOOST_TEST_CONTEXT("step " << run << ", planted grad " << p.grad << ", loss " << p.loss) {
      BOOST_TEST(f.stepped.item<bool>() == done.stepped);
      BOOST_TEST(r[0].item<double>() == (done.stepped ? 1.0 : 0.0));
      if (!done.aborted_by_scaler)
        BOOST_TEST(r[1].item<double>() == (done.decision.action == NanAction::skip_backoff ? 1.0 : 0.0));
      BOOST_TEST(r[2].item<double>() == (done.decision.action == NanAction::abort ? 1.0 : 0.0));
      BOOST_TEST(bits(r[3].item<double>()) == bits(done.clip_coefficient));
      BOOST_TEST(r[4].item<double>() == done.stats.scale);
      BOOST_TEST(r[5].item<double>() == done.scale_next);
      BOOST_TEST(static_cast<double>(device_scale.item<float>()) == done.scale_next);
      BOOST_TEST(f.found_inf.item<float>() == (done.stepped ? 0.0f : 1.0f));
      // What the fused optimizer divides by: the synchronous step's scale / coefficient, in float32.
      BOOST_TEST(f.grad_scale.item<float>() ==
                 static_cast<float>(1.0 / (done.clip_coefficient / done.stats.scale)));
    }
    ++run;
    if (scales != nullptr) scales->push_back(done.scale_next);
    skipped += done.stepped ? 0 : 1;
    if (done.decision.action == NanAction::abort) break;
  }
  return run;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_builtin_device_form_is_its_host_form_bit_for_bit) {
  Plugins plugins;
  const std::vector<std::pair<std::string, Options>> scalers = {
      {"dynamic", {{"init_scale", "65536"}, {"growth_interval", "7"}}},
      {"dynamic",
       {{"init_scale", "1024"},
        {"growth_interval", "3"},
        {"hysteresis", "2"},
        {"growth_factor", "3"},
        {"backoff_factor", "0.3"},
        {"max_scale", "5000"},
        {"min_scale", "4"},
        {"on_min_scale", "clamp"}}},
      {"dynamic", {{"init_scale", "16"}, {"growth_interval", "50"}, {"min_scale", "2"}}},  // stops at min
      {"static", {{"scale", "512"}}},
      {"none", {}}};
  const std::vector<std::pair<std::string, Options>> clippers = {
      {"none", {}}, {"norm", {{"max_norm", "20"}}}, {"norm", {{"max_norm", "30"}, {"norm_type", "inf"}}}};
  const std::vector<std::pair<std::string, Options>> policies = {{"skip", {{"max_consecutive", "0"}}},
                                                                 {"skip", {{"max_consecutive", "5"}}},
                                                                 {"backoff", {{"max_consecutive", "0"}}},
                                                                 {"abort", {{"tolerate_overflow", "true"}}}};
  int combinations = 0, aborted = 0, steps = 0, skipped_total = 0;
  for (const auto& [scaler, so] : scalers)
    for (const auto& [clipper, co] : clippers)
      for (const auto& [policy, po] : policies) {
        BOOST_TEST_CONTEXT(scaler << " + " << clipper << " + " << policy) {
          int skipped = 0;
          const int run = compare(plugins,
                                  {{"scaler", Plugins::choice(scaler, so)},
                                   {"clipper", Plugins::choice(clipper, co)},
                                   {"nan_policy", Plugins::choice(policy, po)}},
                                  skipped);
          steps += run;
          skipped_total += skipped;
          aborted += run < 300;
        }
        ++combinations;
      }
  BOOST_TEST(combinations == 60);
  BOOST_TEST_MESSAGE(steps << " steps compared, " << skipped_total << " skipped, " << aborted
                           << " runs aborted");
  BOOST_TEST(aborted > 0);             // the streak limit, the abort policy, the scale at its minimum
  BOOST_TEST(aborted < combinations);  // and runs that went the whole way
  BOOST_TEST(steps > 60 * 100);
}

// Scaler 'dynamic' with growth_delay: the device rule grows where the host form grows, step for
// step. growth_interval 3, growth_delay 1: after the 4th and the 7th clean step, and the 4th after
// an overflow; then over the random schedule with hysteresis, every clipper and policy with a rule.
BOOST_AUTO_TEST_CASE(the_growth_delay_is_the_same_on_the_device) {
  Plugins plugins;
  std::vector<Planted> script(12);
  script[7].grad = std::numeric_limits<double>::infinity();
  const auto scaler = [](const std::string& delay, const std::string& hysteresis) {
    return Plugins::choice("dynamic", {{"init_scale", "1024"},
                                       {"growth_interval", "3"},
                                       {"growth_delay", delay},
                                       {"hysteresis", hysteresis}});
  };
  int skipped = 0;
  std::vector<double> scales;
  BOOST_TEST(compare(plugins, {{"scaler", scaler("1", "1")}}, skipped, script, &scales) == 12);
  const std::vector<double> expected = {1024, 1024, 1024, 2048, 2048, 2048,
                                        4096, 2048, 2048, 2048, 2048, 4096};
  BOOST_TEST(scales == expected, boost::test_tools::per_element());
  BOOST_TEST(skipped == 1);
  int steps = 0;
  for (const char* clipper : {"none", "norm"})
    for (const auto& [policy, po] : std::vector<std::pair<std::string, Options>>{
             {"skip", {{"max_consecutive", "5"}}}, {"backoff", {{"max_consecutive", "0"}}}, {"abort", {}}}) {
      BOOST_TEST_CONTEXT(clipper << " + " << policy) {
        steps += compare(
            plugins,
            {{"scaler", scaler("2", "2")},
             {"clipper", Plugins::choice(clipper, std::string(clipper) == "norm" ? Options{{"max_norm", "20"}}
                                                                                 : Options{})},
             {"nan_policy", Plugins::choice(policy, po)}},
            skipped);
      }
    }
  BOOST_TEST(steps > 6 * 100);
}

// A strategy without a rule keeps the step synchronous, and the engine says which kind.
BOOST_AUTO_TEST_CASE(a_strategy_without_a_device_form_is_named) {
  Plugins plugins;
  auto set = plugins.strategies({{"scaler", Plugins::choice("predictive")},
                                 {"nan_policy", Plugins::choice("skip", {{"spike_zscore", "6"}})}});
  std::string missing;
  BOOST_TEST(!DeviceStepRules::of(set->scaler(), set->clipper(), set->nan_policy(), missing));
  BOOST_TEST(missing == "scaler");
  auto spikes = plugins.strategies({{"scaler", Plugins::choice("dynamic")},
                                    {"nan_policy", Plugins::choice("skip", {{"spike_zscore", "6"}})}});
  BOOST_TEST(!DeviceStepRules::of(spikes->scaler(), spikes->clipper(), spikes->nan_policy(), missing));
  BOOST_TEST(missing == "nan_policy");  // spike detection needs the recent window: no rule
  auto value = plugins.strategies(
      {{"scaler", Plugins::choice("dynamic")}, {"clipper", Plugins::choice("value", {{"clip_value", "1"}})}});
  BOOST_TEST(!DeviceStepRules::of(value->scaler(), value->clipper(), value->nan_policy(), missing));
  BOOST_TEST(missing == "clipper");
}

// The deferred step (deferred_step.h) against the synchronous one on CPU tensors, for both recipes
// that have it: the same decisions, clip coefficients and scales, step for step; the records reach
// the host forms at most one step late and all of them once drained; no host read is counted.
namespace {

// The synchronous AmpStep and a deferred step's host forms (`host`) over the same strategies
// (dynamic scaling, norm clipping, the backoff policy), each with its own weight of `size`
// elements and its gradient table.
struct SyncAndDeferred {
  std::unique_ptr<StrategySet> sync_set, deferred_set;
  AmpStep sync, host;
  at::Tensor w, v;
  GradientTable sync_table, table;
  SyncAndDeferred(Plugins& plugins, int64_t size, DeviceStatsRecipe recipe)
      : sync_set(plugins.strategies(choices())),
        deferred_set(plugins.strategies(choices())),
        sync({&sync_set->scaler(), &sync_set->clipper(), &sync_set->nan_policy()}),
        host({&deferred_set->scaler(), &deferred_set->clipper(), &deferred_set->nan_policy()}),
        w(at::zeros({size}).set_requires_grad(true)),
        v(at::zeros({size}).set_requires_grad(true)),
        sync_table({w}, {"w"}, recipe),
        table({v}, {"v"}, recipe) {
    sync.start(RunInfo{});
    host.start(RunInfo{});
  }
  static std::map<std::string, StrategyChoice> choices() {
    return {{"scaler", Plugins::choice("dynamic", {{"init_scale", "1048576"}, {"growth_interval", "3"}})},
            {"clipper", Plugins::choice("norm", {{"max_norm", "20"}})},
            {"nan_policy", Plugins::choice("backoff", {{"max_consecutive", "0"}})}};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(the_deferred_step_delivers_what_the_synchronous_step_decides) {
  Plugins plugins;
  for (const auto recipe : {DeviceStatsRecipe::fused_scan, DeviceStatsRecipe::chunk_kernel}) {
    SyncAndDeferred both(plugins, 70000, recipe);
    AmpStep &sync = both.sync, &host = both.host;
    at::Tensor &w = both.w, &v = both.v;
    GradientTable &sync_table = both.sync_table, &table = both.table;
    std::string kind, why;
    auto deferred = DeferredStep::make(host, table, kind, why);
    BOOST_REQUIRE_MESSAGE(deferred, why);
    int delivered = 0, run = 0;
    const std::vector<Planted> steps = schedule(5);
    for (size_t i = 0; i < 60; ++i) {
      const at::Tensor g = at::full({70000}, steps[i].grad / 300.0, at::kFloat) * at::rand({70000});
      const at::Tensor loss = at::full({1}, steps[i].loss, at::kFloat);
      StepOutcome out = sync.begin_iteration();
      w.mutable_grad() = g * static_cast<float>(out.stats.scale);
      sync_table.read_gradients();
      sync.after_backward({sync_table, true, SkippedGradients::keep, loss, nullptr}, out);
      const StepOutcome want = sync.finish_iteration();
      v.mutable_grad() = g * deferred->scale();
      table.read_gradients();
      const int64_t reads = host_reads();
      const DeferredGradients d = deferred->after_backward(table, loss);
      BOOST_TEST(host_reads() == reads);  // no read, on a healthy step or not
      BOOST_TEST_CONTEXT("step " << i) {
        BOOST_TEST(d.stepped.item<bool>() == want.stepped);
        BOOST_TEST(d.found_inf.item<float>() == (want.stepped ? 0.0f : 1.0f));
        const double factor = want.clip_coefficient / want.stats.scale;
        BOOST_TEST(d.grad_scale.item<float>() == static_cast<float>(1.0 / factor));
        BOOST_TEST(deferred->pending() <= 2u);
      }
      delivered += static_cast<int>(deferred->deliver(/*wait=*/false).size());
      BOOST_TEST(host.counters().attempted >= static_cast<int64_t>(i));  // at most one step behind
      ++run;
      if (want.decision.action == NanAction::abort) break;  // the run stops; so does the device
    }
    delivered += static_cast<int>(deferred->deliver(/*wait=*/true).size());
    BOOST_TEST(delivered == run);
    BOOST_TEST(run > 20);
    BOOST_TEST(host.counters().attempted == sync.counters().attempted);
    BOOST_TEST(host.counters().taken == sync.counters().taken);
    BOOST_TEST(host.scale() == sync.scale());
    BOOST_TEST(host.last_outcome().clip_coefficient == sync.last_outcome().clip_coefficient);
  }
}

// A step captured in a CUDA graph (deferred_step.h): on CPU tensors a "captured" step runs at
// once, so its record is the one a replay writes. The first step runs uncaptured, every later one
// as captured: the records wait in the ring (8 rows here) until the host reads them, two host reads
// per read, none per step; delivered in order (the uncaptured step's first), they are the
// synchronous step's. More steps than rows between two reads: refused, now and from then on.
BOOST_AUTO_TEST_CASE(captured_steps_wait_in_the_ring_until_the_host_reads_them) {
  Plugins plugins;
  SyncAndDeferred both(plugins, 5000, DeviceStatsRecipe::chunk_kernel);
  AmpStep &sync = both.sync, &host = both.host;
  at::Tensor &w = both.w, &v = both.v;
  GradientTable &sync_table = both.sync_table, &table = both.table;
  std::string kind, why;
  auto deferred = DeferredStep::make(host, table, kind, why);
  BOOST_REQUIRE_MESSAGE(deferred, why);
  const at::Tensor loss = at::full({1}, 2.0, at::kFloat);
  v.mutable_grad() = at::ones({5000});
  table.read_gradients();
  BOOST_CHECK_THROW(deferred->after_backward(table, loss, /*capturing=*/true), Error);  // not allowed
  deferred->allow_graphs(8);
  BOOST_CHECK_THROW(deferred->after_backward(table, loss, /*capturing=*/true), Error);  // no warm-up
  const std::vector<Planted> steps = schedule(11);
  int delivered = 0;
  for (size_t i = 0; i < 40; ++i) {
    const at::Tensor g = at::full({5000}, steps[i].grad / 300.0, at::kFloat) * at::rand({5000});
    StepOutcome out = sync.begin_iteration();
    w.mutable_grad() = g * static_cast<float>(out.stats.scale);
    sync_table.read_gradients();
    sync.after_backward({sync_table, true, SkippedGradients::keep, loss, nullptr}, out);
    const StepOutcome want = sync.finish_iteration();
    v.mutable_grad() = g * deferred->scale();
    table.read_gradients();
    int64_t reads = host_reads();
    const DeferredGradients d = deferred->after_backward(table, loss, /*capturing=*/i > 0);
    BOOST_TEST(host_reads() == reads);
    BOOST_TEST_CONTEXT("step " << i) {
      BOOST_TEST(d.stepped.item<bool>() == want.stepped);
      BOOST_TEST(d.grad_scale.item<float>() ==
                 static_cast<float>(1.0 / (want.clip_coefficient / want.stats.scale)));
    }
    BOOST_TEST(deferred->in_graph() == (i > 0));
    // Step 0's record (uncaptured) arrives as before; the ring's wait for a read.
    const size_t arrived = deferred->deliver(/*wait=*/false).size();
    BOOST_TEST(arrived == (i == 0 ? 1u : 0u));
    delivered += static_cast<int>(arrived);
    if (i % 5 == 4) {
      reads = host_reads();
      delivered += static_cast<int>(deferred->deliver(/*wait=*/true).size());
      BOOST_TEST(host_reads() - reads == 2);  // the count, then the rows
      BOOST_TEST(delivered == static_cast<int>(i) + 1);
      BOOST_TEST(host.counters().attempted == sync.counters().attempted);
      BOOST_TEST(host.scale() == sync.scale());
    }
  }
  BOOST_TEST(delivered == 40);
  BOOST_TEST(sync.counters().attempted > sync.counters().taken);  // the schedule had bad steps
  BOOST_TEST(host.counters().taken == sync.counters().taken);
  BOOST_TEST(host.last_outcome().clip_coefficient == sync.last_outcome().clip_coefficient);
  BOOST_TEST(deferred->deliver(/*wait=*/true).empty());  // nothing twice
  // A later step must measure what the capture measured (here: no loss), refused before it runs.
  const float scale_before = deferred->scale().item<float>();
  BOOST_CHECK_THROW(deferred->after_backward(table, at::Tensor(), /*capturing=*/false), Error);
  BOOST_TEST(deferred->unread_rows() == 0);
  BOOST_TEST(deferred->scale().item<float>() == scale_before);
  // After a capture every step goes through the ring, captured or not: 9 of them over 8 rows.
  for (int i = 0; i < 9; ++i) deferred->after_backward(table, loss, /*capturing=*/false);
  BOOST_TEST(deferred->unread_rows() == 9);
  for (int attempt = 0; attempt < 2; ++attempt) {  // refused, and refused again
    try {
      deferred->deliver(/*wait=*/true);
      BOOST_FAIL("9 steps over 8 rows were delivered");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find("the oldest 1 were overwritten") != std::string::npos, e.what());
    }
  }
  BOOST_CHECK_THROW(deferred->after_backward(table, loss, /*capturing=*/true), Error);
}

// Records that arrive late (as a GPU's may: set_late_arrivals runs that order on a CPU): those
// after_backward delivers on its own come out of the next deliver(), in order, none lost or twice.
// Inside an iteration (between its step and its update) a waited-for deliver can hold the newest
// record back (the host forms then hold the state before the iteration's update, as torch's
// GradScaler shows it), or open it: the host forms take the iteration over and finish it as the
// synchronous step does.
BOOST_AUTO_TEST_CASE(late_records_come_in_order_and_an_open_iteration_can_be_held_or_taken_over) {
  Plugins plugins;
  SyncAndDeferred both(plugins, 5000, DeviceStatsRecipe::fused_scan);
  AmpStep &sync = both.sync, &host = both.host;
  std::string kind, why;
  auto deferred = DeferredStep::make(host, both.table, kind, why);
  BOOST_REQUIRE_MESSAGE(deferred, why);
  deferred->set_late_arrivals(true);
  const at::Tensor loss = at::full({1}, 2.0, at::kFloat);
  const std::vector<Planted> steps = schedule(3);
  std::vector<int64_t> order;
  auto take = [&](std::vector<StepOutcome> outcomes) {
    for (const StepOutcome& o : outcomes) order.push_back(o.stats.step);
  };
  for (size_t i = 0; i < 30; ++i) {
    const at::Tensor g = at::full({5000}, steps[i].grad / 300.0, at::kFloat) * at::rand({5000});
    const double scale_used = sync.scale();
    StepOutcome out = sync.begin_iteration();
    both.w.mutable_grad() = g * static_cast<float>(out.stats.scale);
    both.sync_table.read_gradients();
    sync.after_backward({both.sync_table, true, SkippedGradients::keep, loss, nullptr}, out);
    both.v.mutable_grad() = g * deferred->scale();
    both.table.read_gradients();
    deferred->after_backward(both.table, loss);
    BOOST_TEST(deferred->pending() <= 2u);
    if (i == 12) {  // a host read inside the iteration: everything but this step's own record
      take(deferred->deliver(/*wait=*/true, DeferredStep::Newest::hold));
      BOOST_TEST(deferred->pending() == 1u);
      BOOST_TEST(host.scale() == scale_used);
      BOOST_TEST(host.counters().attempted == static_cast<int64_t>(i));
    }
    if (i == 25) {  // a state change inside the iteration: the host forms finish it
      take(deferred->deliver(/*wait=*/true, DeferredStep::Newest::open));
      BOOST_TEST(deferred->pending() == 0u);
      BOOST_TEST(host.iteration_size() == 1u);
      BOOST_TEST(host.counters().attempted == static_cast<int64_t>(i));  // the open one is not counted yet
      const StepOutcome want = sync.finish_iteration();
      const StepOutcome got = host.finish_iteration();
      BOOST_TEST(got.stepped == want.stepped);
      BOOST_TEST(got.scale_next == want.scale_next);
      BOOST_TEST(host.counters().taken == sync.counters().taken);
      break;
    }
    sync.finish_iteration();
    const size_t before = order.size();
    take(deferred->deliver(/*wait=*/false));  // late: only what after_backward delivered
    BOOST_TEST(order.size() - before <= 1u);
  }
  BOOST_TEST(order.size() == 25u);  // steps 0-24 delivered; 25 taken over
  for (size_t i = 0; i < order.size(); ++i) BOOST_TEST(order[i] == static_cast<int64_t>(i));
  BOOST_TEST(host.counters().attempted == sync.counters().attempted);
  BOOST_TEST(host.scale() == sync.scale());
}

// Linear(8 -> 4) under FusedAdamW with built-in strategies: the Trainer both ways.
using test::FusedRun;

// Trainer::deferred_backward/deferred_update against Trainer::step over 80 fp16 steps with
// overflows, a NaN loss and clipping, for both deferred recipes: every outcome (per-gradient norms
// included) and the parameters, bit for bit; one host read per synchronous step, none deferred.
BOOST_AUTO_TEST_CASE(the_trainers_deferred_step_is_its_synchronous_step) {
  Plugins plugins;
  const std::map<std::string, StrategyChoice> choices = {
      {"scaler", Plugins::choice("dynamic", {{"init_scale", "1024"}, {"growth_interval", "4"}})},
      {"clipper", Plugins::choice("norm", {{"max_norm", "0.05"}})},
      {"nan_policy", Plugins::choice("backoff", {})}};
  for (const DeviceStatsRecipe recipe : {DeviceStatsRecipe::fused_scan, DeviceStatsRecipe::chunk_kernel}) {
    BOOST_TEST_CONTEXT(to_string(recipe)) {
      test::TinyModel start;
      FusedRun sync(plugins, choices, start), deferred(plugins, choices, start);
      sync.trainer.set_stats_recipe(recipe);
      deferred.trainer.set_stats_recipe(recipe);
      std::string kind;
      BOOST_REQUIRE_EQUAL(deferred.trainer.enable_deferred_step(kind, /*tensor_norms=*/true), "");
      const auto forward = [](test::TinyModel& m, int64_t step) {
        return [&m, step](int) {
          at::Tensor loss = m.loss(test::batch_x(step));
          if (step % 9 == 4) loss = loss * std::numeric_limits<float>::infinity();
          if (step == 30) loss = loss * std::nan("");
          return loss;
        };
      };
      std::vector<StepOutcome> want, got;
      int64_t sync_reads = 0, deferred_reads = 0;
      for (int64_t step = 0; step < 80; ++step) {
        int64_t before = host_reads();
        want.push_back(sync.trainer.step(forward(sync.model, step)));
        sync_reads += host_reads() - before;
        before = host_reads();
        const Trainer::DeferredBackward b = deferred.trainer.deferred_backward(forward(deferred.model, step));
        BOOST_TEST(!b.redo);  // no bad-step observer
        got.insert(got.end(), b.delivered.begin(), b.delivered.end());
        deferred.trainer.deferred_update();
        deferred_reads += host_reads() - before;
        BOOST_TEST(got.size() == static_cast<size_t>(step));  // one step behind, never more
      }
      for (const StepOutcome& o : deferred.trainer.settle()) got.push_back(o);
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      int skipped = 0, clipped = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        BOOST_TEST_CONTEXT("step " << i) {
          const StepOutcome &w = want[i], &g = got[i];
          BOOST_TEST(g.stats.step == w.stats.step);
          BOOST_TEST(g.stepped == w.stepped);
          BOOST_TEST(to_string(g.decision.action) == to_string(w.decision.action));
          BOOST_TEST(bits(g.stats.scale) == bits(w.stats.scale));
          BOOST_TEST(bits(g.scale_next) == bits(w.scale_next));
          BOOST_TEST(bits(g.clip_coefficient) == bits(w.clip_coefficient));
          BOOST_TEST(bits(g.lr) == bits(w.lr));
          if (w.stepped) {
            BOOST_TEST(bits(g.stats.grad_norm) == bits(w.stats.grad_norm));
            BOOST_TEST(bits(g.stats.loss) == bits(w.stats.loss));
          }
          BOOST_REQUIRE_EQUAL(g.stats.tensor_norms.size(), w.stats.tensor_norms.size());
          for (size_t t = 0; t < w.stats.tensor_norms.size(); ++t)
            BOOST_TEST(bits(g.stats.tensor_norms[t]) == bits(w.stats.tensor_norms[t]));
          skipped += !w.stepped;
          clipped += w.stepped && w.clip_coefficient < 1.0;
        }
      }
      BOOST_TEST(skipped == 10);  // 9 overflows (steps 4, 13, ..., 76) and the NaN
      BOOST_TEST(clipped > 10);
      BOOST_TEST(sync_reads == 80);
      BOOST_TEST(deferred_reads == 0);
      BOOST_TEST(at::equal(sync.model.layer->weight, deferred.model.layer->weight));
      BOOST_TEST(at::equal(sync.model.layer->bias, deferred.model.layer->bias));
      BOOST_TEST(deferred.trainer.steps_taken() == sync.trainer.steps_taken());
      // The optimizer's own step counts (what checkpoints save) follow the steps taken.
      for (const auto& p : deferred.model.params()) {
        const auto& state = static_cast<const torch::optim::AdamWParamState&>(
            *deferred.optimizer.state().at(p.unsafeGetTensorImpl()));
        BOOST_TEST(state.step() == sync.trainer.steps_taken());
      }
    }
  }
}
