// NaN policies: decisions on scripted step statistics, escalation, spike detection, state.
#define BOOST_TEST_MODULE nan_policies
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "builtin_plugins.h"

using namespace ampkit;

namespace {

std::unique_ptr<NanPolicy> make(const std::string& name, std::map<std::string, std::string> options = {}) {
  static test::BuiltinPlugins plugins;
  std::unique_ptr<Strategy> s = plugins.make("nan_policy", name, std::move(options));
  return std::unique_ptr<NanPolicy>(static_cast<NanPolicy*>(s.release()));
}

StepStats healthy(double loss, double norm, int64_t streak = 0) {
  StepStats s;
  s.loss = loss;
  s.grad_norm = norm;
  s.scale = 1024;
  s.consecutive_skips = streak;
  return s;
}

StepStats overflow(int64_t streak) {
  StepStats s = healthy(1.0, INFINITY, streak);
  s.found_inf = true;
  return s;
}

StepStats nan_loss(int64_t streak) {
  StepStats s = healthy(NAN, NAN, streak);
  s.loss_finite = false;
  s.found_inf = true;
  return s;
}

// Drives a policy like the engine does: the streak counts consecutive non-proceed steps.
std::vector<std::string> actions(NanPolicy& p, const std::vector<StepStats>& steps) {
  std::vector<std::string> out;
  int64_t streak = 0;
  for (StepStats s : steps) {
    s.consecutive_skips = streak;
    const NanDecision d = p.decide(s);
    out.emplace_back(to_string(d.action));
    streak = d.action == NanAction::proceed ? 0 : streak + 1;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(skip_skips_bad_steps_and_aborts_after_the_streak_limit) {
  auto p = make("skip", {{"max_consecutive", "3"}});
  const auto a = actions(
      *p, {healthy(1, 1), overflow(0), overflow(0), healthy(1, 1), nan_loss(0), overflow(0), overflow(0)});
  const std::vector<std::string> expected = {"proceed", "skip", "skip", "proceed", "skip", "skip", "abort"};
  BOOST_TEST(a == expected, boost::test_tools::per_element());
  const NanDecision d = p->decide(nan_loss(2));
  BOOST_TEST(d.reason.find("non-finite loss (nan); 3 consecutive bad steps (nan_policy.max_consecutive=3)") ==
             0u);
  auto never = make("skip", {{"max_consecutive", "0"}});
  BOOST_TEST(to_string(never->decide(overflow(100000)).action) == std::string("skip"));
}

BOOST_AUTO_TEST_CASE(backoff_asks_the_scaler_only_for_overflow) {
  auto p = make("backoff", {{"max_consecutive", "4"}, {"spike_zscore", "6"}, {"spike_min_samples", "5"}});
  std::vector<StepStats> steps;
  for (int i = 0; i < 10; ++i) steps.push_back(healthy(2.0 + 0.01 * (i % 3), 1.0 + 0.01 * (i % 2)));
  steps.push_back(overflow(0));
  steps.push_back(healthy(50.0, 1.0));  // loss spike
  steps.push_back(nan_loss(0));
  steps.push_back(overflow(0));
  const auto a = actions(*p, steps);
  BOOST_TEST(a[9] == "proceed");
  BOOST_TEST(a[10] == "skip_backoff");
  BOOST_TEST(a[11] == "skip");
  BOOST_TEST(a[12] == "skip_backoff");
  BOOST_TEST(a[13] == "abort");
}

BOOST_AUTO_TEST_CASE(abort_stops_at_the_first_bad_loss_and_tolerates_overflow_by_default) {
  auto p = make("abort");
  BOOST_TEST(to_string(p->decide(healthy(1, 1)).action) == std::string("proceed"));
  BOOST_TEST(to_string(p->decide(overflow(0)).action) == std::string("skip"));
  const NanDecision d = p->decide(nan_loss(1));
  BOOST_TEST(to_string(d.action) == std::string("abort"));
  BOOST_TEST(d.reason == "non-finite loss (nan)");
  auto strict = make("abort", {{"tolerate_overflow", "false"}});
  BOOST_TEST(to_string(strict->decide(overflow(0)).action) == std::string("abort"));
}

BOOST_AUTO_TEST_CASE(spikes_are_judged_by_a_rolling_zscore_of_healthy_steps) {
  auto p = make("skip", {{"spike_window", "8"}, {"spike_zscore", "4"}, {"spike_min_samples", "4"}});
  // Window values 1.0, 1.1 alternating: mean 1.05, sample sd 0.0535 (8 values).
  std::vector<StepStats> steps;
  for (int i = 0; i < 8; ++i) steps.push_back(healthy(i % 2 ? 1.1 : 1.0, 3.0 + (i % 2 ? 0.1 : 0.0)));
  steps.push_back(healthy(1.2, 3.0));   // z = (1.2 - 1.05) / 0.0535 = 2.8: healthy
  steps.push_back(healthy(1.5, 3.0));   // z > 4 against the updated window: loss spike
  steps.push_back(healthy(1.05, 9.0));  // gradient-norm spike
  const auto a = actions(*p, steps);
  BOOST_TEST(a[8] == "proceed");
  BOOST_TEST(a[9] == "skip");
  BOOST_TEST(a[10] == "skip");
  StepStats spike = healthy(1.5, 3.0);
  const NanDecision d = p->decide(spike);
  BOOST_TEST(d.reason.find("loss spike: 1.5 is ") == 0u);
  BOOST_TEST(d.reason.find("standard deviations above the recent mean") != std::string::npos);
  // Off by default: the same sequence never skips.
  auto off = make("skip");
  const auto b = actions(*off, steps);
  BOOST_TEST(std::count(b.begin(), b.end(), "proceed") == 11);
}

BOOST_AUTO_TEST_CASE(saved_detector_state_continues_identically) {
  const std::map<std::string, std::string> o = {
      {"spike_window", "16"}, {"spike_zscore", "3"}, {"spike_min_samples", "4"}};
  auto a = make("skip", o);
  std::vector<StepStats> first, second;
  for (int i = 0; i < 12; ++i) first.push_back(healthy(1.0 + 0.05 * std::sin(i), 2.0 + 0.1 * std::cos(i)));
  for (int i = 0; i < 12; ++i)
    second.push_back(healthy(1.0 + 0.3 * std::sin(3 * i), 2.0 + 0.5 * std::cos(2 * i)));
  actions(*a, first);
  const State saved = a->save();
  BOOST_TEST(saved.get<std::vector<double>>("loss_window").size() == 12u);
  auto b = make("skip", o);
  b->load(saved);
  BOOST_TEST(actions(*a, second) == actions(*b, second), boost::test_tools::per_element());
  BOOST_TEST((a->save() == b->save()));
}

// A checkpoint's windows are bounded by this run's options: more values than
// spike_window, or a value no run puts there, is refused whole, and the policy keeps its own.
BOOST_AUTO_TEST_CASE(a_detector_window_beyond_the_options_is_refused) {
  const std::map<std::string, std::string> o = {
      {"spike_window", "16"}, {"spike_zscore", "3"}, {"spike_min_samples", "4"}};
  for (const char* policy : {"skip", "backoff", "abort"}) {
    auto p = make(policy, o);
    for (int i = 0; i < 5; ++i) p->decide(healthy(1.0 + 0.01 * i, 2.0));
    const State before = p->save();
    const auto refused = [&](const std::string& key, std::vector<double> values, const std::string& says) {
      State s = before;
      s.set(key, std::move(values));
      try {
        p->load(s);
        BOOST_ERROR(policy << ": " << key << " was loaded");
      } catch (const std::runtime_error& e) {
        BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
      }
      BOOST_TEST((p->save() == before));  // nothing of it loaded
    };
    refused("loss_window", std::vector<double>(1000000, 1.0),
            "checkpoint loss_window holds 1000000 values, more than this run's nan_policy.spike_window=16");
    refused("grad_norm_window", std::vector<double>(17, 1.0), "grad_norm_window holds 17 values");
    refused("loss_window", {1.0, std::nan("")}, "loss_window holds nan: a window holds finite values only");
    refused("grad_norm_window", {-1.0}, "grad_norm_window holds -1: a window holds finite norms >= 0 only");
    State ok = before;
    ok.set("loss_window", std::vector<double>(16, -3.5));  // a full window of (negative) losses loads
    BOOST_CHECK_NO_THROW(p->load(ok));
  }
}

BOOST_AUTO_TEST_CASE(rollback_rolls_back_after_the_streak_and_aborts_after_max_rollbacks) {
  auto p = make("rollback", {{"rollback_after", "2"}, {"max_rollbacks", "2"}, {"skip_batches", "7"}});
  BOOST_TEST(p->rollback_plan().snapshot_every == 100);
  BOOST_TEST(!p->rollback_plan().from_checkpoint);
  // A NaN loss is bad whatever the scale; one in a row is skipped, the second rolls back.
  const auto a = actions(*p, {healthy(1, 1), nan_loss(0), nan_loss(0), healthy(1, 1), nan_loss(0),
                              healthy(1, 1), nan_loss(0), nan_loss(0), nan_loss(0), nan_loss(0)});
  const std::vector<std::string> expected = {"proceed", "skip", "rollback", "proceed", "skip",
                                             "proceed", "skip", "rollback", "skip",    "abort"};
  BOOST_TEST(a == expected, boost::test_tools::per_element());
  StepStats s = nan_loss(0);
  auto q = make("rollback", {{"skip_batches", "7"}});
  const NanDecision d = q->decide(s);
  BOOST_TEST(to_string(d.action) == std::string("rollback"));
  BOOST_TEST(d.skip_batches == 7);
}

BOOST_AUTO_TEST_CASE(rollback_leaves_scaled_overflow_to_the_scaler) {
  auto p = make("rollback");
  // Finite loss, non-finite gradients at scale 1024: the scaler's routine overflow, skipped.
  BOOST_TEST(to_string(p->decide(overflow(0)).action) == std::string("skip"));
  // At scale 1 the same gradients are a real fault.
  StepStats s = overflow(0);
  s.scale = 1;
  BOOST_TEST(to_string(p->decide(s).action) == std::string("rollback"));
}

BOOST_AUTO_TEST_CASE(rollback_counts_survive_save_and_load) {
  auto p = make("rollback", {{"max_rollbacks", "1"}, {"snapshot", "checkpoint"}});
  BOOST_TEST(p->rollback_plan().from_checkpoint);
  BOOST_TEST(p->rollback_plan().snapshot_every == 0);
  BOOST_TEST(to_string(p->decide(nan_loss(0)).action) == std::string("rollback"));
  auto q = make("rollback", {{"max_rollbacks", "1"}, {"snapshot", "checkpoint"}});
  q->load(p->save());
  BOOST_TEST(to_string(q->decide(nan_loss(0)).action) == std::string("abort"));
}

// on_spike=clip: a finite spike proceeds with clip_norm = the grad window's mean + zscore * sd
// (sample sd); a non-finite step is never clipped; the clipped spike stays out of the window.
BOOST_AUTO_TEST_CASE(on_spike_clip_applies_finite_spikes_at_the_window_ceiling) {
  const std::vector<double> norms = {1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9};
  double mean = 0, var = 0;
  for (double n : norms) mean += n / 8.0;
  for (double n : norms) var += (n - mean) * (n - mean) / 7.0;
  const double ceiling = mean + 6.0 * std::sqrt(var);
  for (const std::string name : {"skip", "backoff", "rollback"}) {
    BOOST_TEST_CONTEXT(name) {
      auto p = make(name, {{"on_spike", "clip"}, {"spike_zscore", "6"}, {"spike_min_samples", "5"}});
      for (double n : norms)
        BOOST_TEST(to_string(p->decide(healthy(2.0, n)).action) == std::string("proceed"));
      const NanDecision grad_spike = p->decide(healthy(2.0, 40.0));
      BOOST_TEST(to_string(grad_spike.action) == std::string("clip"));
      BOOST_TEST(grad_spike.clip_norm == ceiling, boost::test_tools::tolerance(1e-12));
      const NanDecision loss_spike = p->decide(healthy(90.0, 1.0));  // the loss jumped, not the norm
      BOOST_TEST(to_string(loss_spike.action) == std::string("clip"));
      BOOST_TEST(loss_spike.clip_norm == ceiling, boost::test_tools::tolerance(1e-12));  // window unchanged
      BOOST_TEST(to_string(p->decide(nan_loss(0)).action) != std::string("clip"));
      BOOST_TEST(to_string(p->decide(overflow(0)).action) != std::string("clip"));
    }
  }
  // The defaults are unchanged: skip and backoff skip a spike, rollback rolls back.
  for (const auto& [name, action] : std::vector<std::pair<std::string, std::string>>{
           {"skip", "skip"}, {"backoff", "skip"}, {"rollback", "rollback"}}) {
    auto p = make(name, {{"spike_zscore", "6"}, {"spike_min_samples", "5"}});
    for (double n : norms) p->decide(healthy(2.0, n));
    BOOST_TEST(to_string(p->decide(healthy(2.0, 40.0)).action) == action, name);
  }
  auto rollback_skips =
      make("rollback", {{"on_spike", "skip"}, {"spike_zscore", "6"}, {"spike_min_samples", "5"}});
  for (double n : norms) rollback_skips->decide(healthy(2.0, n));
  BOOST_TEST(to_string(rollback_skips->decide(healthy(2.0, 40.0)).action) == std::string("skip"));
  BOOST_TEST(to_string(rollback_skips->decide(nan_loss(0)).action) == std::string("rollback"));
}
