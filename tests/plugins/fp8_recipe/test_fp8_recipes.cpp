// fp8 recipe tests: current, delayed and predictive loaded through the registry, driven on fixed
// amax traces, their scales compared bit for bit with float32 values; save/load; the StrategySet
// leaving the optional kind out unless one is named.
#define BOOST_TEST_MODULE fp8_recipes
#include <boost/test/unit_test.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/fp8_recipe.h"
#include "builtin_plugins.h"

using namespace ampkit;

namespace {

using Plugins = ampkit::test::BuiltinPlugins;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

struct Recipe {
  std::unique_ptr<Strategy> strategy;
  Fp8Recipe& operator*() const { return *dynamic_cast<Fp8Recipe*>(strategy.get()); }
  Fp8Recipe* operator->() const { return &**this; }
};

Recipe make(Plugins& p, const std::string& name, std::map<std::string, std::string> options = {}) {
  return {p.make("fp8_recipe", name, std::move(options))};
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

// One tensor of `role`, updated once per amax of `trace` from scale 1.0 and an empty history:
// the scale after each step.
std::vector<float> scales_of(Fp8Recipe& r, const std::vector<float>& trace, int64_t role = 0) {
  const int64_t w = r.history_length();
  std::vector<float> history(w, 0.0f), out;
  float scale = 1.0f;
  for (float amax : trace) {
    r.update(1, &role, &amax, history.data(), &scale);
    out.push_back(scale);
  }
  return out;
}

void check_scales(const std::vector<float>& got, const std::vector<float>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    BOOST_TEST(same_bits(got[i], want[i]), "step " << i << ": " << got[i] << " != " << want[i]);
}

}  // namespace

BOOST_AUTO_TEST_CASE(current_is_torchaos_tensorwise_scale_rounded_from_float64) {
  Plugins p;
  Recipe r = make(p, "current");
  BOOST_TEST(r->history_length() == 0);
  BOOST_TEST(r->current_scaling());
  BOOST_TEST(r->current_eps() == 1e-12);
  BOOST_TEST(std::string(r->format(0)) == "e4m3");
  BOOST_TEST(std::string(r->format(1)) == "e4m3");
  BOOST_TEST(std::string(r->format(2)) == "e5m2");
  const std::vector<int64_t> roles = {0, 1, 2, 2, 0, 2};
  const std::vector<float> amax = {1.0f, 0.0f, 3.7f, 0.0f, kInf, kNan};
  std::vector<float> scale(6, 1.0f);
  BOOST_TEST(r->update(6, roles.data(), amax.data(), nullptr, scale.data()) == 2);  // inf, NaN
  // 57344 / float32(3.7) in float64 is 15498.37792..., rounded once to float32.
  check_scales(scale, {448.0f, 447999985582080.0f, 15498.3779296875f, 5.734399815450624e16f, 1.0f, 1.0f});
  Recipe e4m3 = make(p, "current", {{"format", "e4m3"}});
  BOOST_TEST(std::string(e4m3->format(2)) == "e4m3");
  check_scales(scales_of(*e4m3, {3.7f}, 2), {121.0810775756836f});
}

BOOST_AUTO_TEST_CASE(delayed_scales_follow_the_largest_amax_of_a_window_that_forgets) {
  Plugins p;
  Recipe r = make(p, "delayed", {{"amax_history_len", "4"}});
  BOOST_TEST(r->history_length() == 4);
  BOOST_TEST(!r->current_scaling());
  // 100 stays the window's maximum for 4 steps, then leaves it: the scale rises to 448 / 1.
  check_scales(scales_of(*r, {100, 1, 1, 1, 1, 1}), {4.48f, 4.48f, 4.48f, 4.48f, 448.0f, 448.0f});
  // Growth: each scale from this step's amax, the largest so far; decay: held at the maximum.
  check_scales(scales_of(*r, {1, 2, 4, 8}), {448, 224, 112, 56});
  check_scales(scales_of(*r, {8, 4, 2, 1}), {56, 56, 56, 56});
  Recipe recent = make(p, "delayed", {{"amax_history_len", "4"}, {"amax_compute_algo", "most_recent"}});
  check_scales(scales_of(*recent, {8, 4, 2, 1}), {56, 112, 224, 448});
  // grad_output under hybrid: e5m2's 57344; margin 2: a quarter of each.
  check_scales(scales_of(*r, {7}, 2), {8192});
  Recipe margin = make(p, "delayed", {{"margin", "2"}});
  check_scales(scales_of(*margin, {1, 7}, 0), {112, 16});
  // The default window is Transformer Engine's 1024.
  BOOST_TEST(make(p, "delayed")->history_length() == 1024);
}

BOOST_AUTO_TEST_CASE(delayed_leaves_a_zero_or_bad_amax_out_of_window_and_scale) {
  Plugins p;
  Recipe r = make(p, "delayed", {{"amax_history_len", "3"}});
  const std::vector<int64_t> roles = {0, 1, 2, 1};
  std::vector<float> history = {2, 1, 0, 5, 0, 0, 3, 3, 3, 4, 0, 0};
  std::vector<float> scale = {224, 89.6f, 19114.666f, 112};
  const std::vector<float> before = history;
  const std::vector<float> amax = {0.0f, kInf, kNan, 8.0f};
  BOOST_TEST(r->update(4, roles.data(), amax.data(), history.data(), scale.data()) == 2);
  for (size_t i = 0; i < 9; ++i) BOOST_TEST(same_bits(history[i], before[i]), "history " << i);
  BOOST_TEST(history[9] == 8.0f);  // the one good amax, newest first, in its own row
  BOOST_TEST(history[10] == 4.0f);
  check_scales(scale, {224, 89.6f, 19114.666f, 56});
  // A non-negative amax so small that 448 / it overflows gives FLT_MAX, not inf.
  check_scales(scales_of(*r, {1e-45f}), {FLT_MAX});
  // A negative amax cannot be a maximum of absolute values: bad, as a non-finite one.
  float neg = -1.0f, s = 3.0f;
  std::vector<float> h(3, 0.0f);
  const int64_t role = 0;
  BOOST_TEST(r->update(1, &role, &neg, h.data(), &s) == 1);
  BOOST_TEST(s == 3.0f);
}

BOOST_AUTO_TEST_CASE(predictive_forecasts_growth_and_keeps_delayeds_scale_when_stable) {
  Plugins p;
  Recipe r = make(p, "predictive", {{"amax_history_len", "8"}});
  // Doubling amaxes: estimate = amax * 2 from the second step on, so the next amax fits.
  check_scales(scales_of(*r, {1, 2, 4, 8}), {448, 112, 56, 28});
  // Stable and decaying: growth 1, the scale is delayed's (the window's maximum).
  check_scales(scales_of(*r, {3, 3, 3}), {149.33333f, 149.33333f, 149.33333f});
  check_scales(scales_of(*r, {8, 4, 2}), {56, 56, 56});
  // A jump of 100x is clamped to max_growth 4: estimate 400, kept while the jump is among the
  // last trend_steps ratios (here 2), then the window's maximum 100.
  Recipe short_trend = make(p, "predictive", {{"amax_history_len", "8"}, {"trend_steps", "2"}});
  check_scales(scales_of(*short_trend, {1, 100, 100, 100}), {448, 1.12f, 1.12f, 4.48f});
  // Bad amaxes: counted, no change, as delayed.
  std::vector<float> h(8, 0.0f);
  float amax = kNan, s = 5.0f;
  const int64_t role = 1;
  BOOST_TEST(r->update(1, &role, &amax, h.data(), &s) == 1);
  BOOST_TEST(s == 5.0f);
  BOOST_TEST((h == std::vector<float>(8, 0.0f)));
  // A window of one amax has no trend: refused with the option's name.
  BOOST_CHECK_EXCEPTION(make(p, "predictive", {{"amax_history_len", "1"}}), std::exception,
                        [](const std::exception& e) {
                          return std::string(e.what()).find("amax_history_len") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(recipes_save_their_history_width_and_refuse_another) {
  Plugins p;
  Recipe a = make(p, "delayed", {{"amax_history_len", "16"}});
  const State saved = a->save();
  BOOST_TEST(saved.get<int64_t>("history_length") == 16);
  Recipe b = make(p, "predictive", {{"amax_history_len", "16"}});
  BOOST_CHECK_NO_THROW(b->load(saved));
  BOOST_TEST((b->save() == saved));
  Recipe c = make(p, "delayed", {{"amax_history_len", "8"}});
  BOOST_CHECK_EXCEPTION(c->load(saved), std::runtime_error, [](const std::runtime_error& e) {
    return std::string(e.what()) ==
           "fp8_recipe 'delayed': the checkpoint's amax histories hold 16 amaxes per tensor but this "
           "recipe keeps 8";
  });
  BOOST_TEST(make(p, "current")->save().get<int64_t>("history_length") == 0);
}

BOOST_AUTO_TEST_CASE(a_strategy_set_has_an_fp8_recipe_only_when_one_is_named) {
  Plugins p;
  auto plain = p.strategies();
  BOOST_TEST(!plain->has("fp8_recipe"));
  BOOST_TEST(plain->fp8_recipe() == nullptr);
  BOOST_TEST(plain->all().size() == 4u);
  auto with = p.strategies({{"fp8_recipe", Plugins::choice("delayed", {{"amax_history_len", "4"}})}});
  BOOST_REQUIRE(with->fp8_recipe() != nullptr);
  BOOST_TEST(with->fp8_recipe()->history_length() == 4);
  BOOST_TEST(with->all().size() == 5u);
  // Guarded: a role out of range is a plugin-call failure naming the recipe and the call.
  const int64_t role = 7;
  float amax = 1.0f, s = 1.0f, h[4] = {};
  BOOST_CHECK_EXCEPTION(with->fp8_recipe()->update(1, &role, &amax, h, &s), Error, [](const Error& e) {
    const std::string what = e.what();
    return what.find("fp8_recipe 'delayed'") != std::string::npos &&
           what.find("update()") != std::string::npos && what.find("role 7") != std::string::npos;
  });
}
