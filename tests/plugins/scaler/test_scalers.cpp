// Scaler tests: `dynamic` against torch.amp.GradScaler's golden sequences and Megatron's hysteresis,
// `predictive` on scripted gradient maxima, save/load, option checks, and the scale in the Trainer.
#define BOOST_TEST_MODULE scalers
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "ampkit/trainer.h"
#include "builtin_plugins.h"
#include "test_paths.h"

using namespace ampkit;

namespace ampkit {
// Lets BOOST_TEST print a scaler's state when two differ.
std::ostream& operator<<(std::ostream& out, const State& state) {
  out << "{";
  for (const auto& [key, value] : state.values()) {
    out << " " << key << "=";
    std::visit(
        [&out](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<double>>) {
            out << "[";
            for (double x : v) out << " " << x;
            out << " ]";
          } else {
            out << v;
          }
        },
        value);
  }
  return out << " }";
}
}  // namespace ampkit

namespace {

// The golden file lives in tests/data (tools/golden/gradscaler_sequences.py writes it).
const std::string kGoldenFile =
    std::string(ampkit::test::source_dir()) + "/tests/data/gradscaler_sequences.json";

using Plugins = ampkit::test::BuiltinPlugins;

LossScaler& as_scaler(const std::unique_ptr<Strategy>& s) {
  return *dynamic_cast<LossScaler*>(s.get());
}

// Exact text of a double for an option value (17 significant digits round-trip).
std::string text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

StepStats clean(double max_abs = 0.01) {
  StepStats s;
  s.grad_max_abs = max_abs;
  return s;
}

StepStats overflow() {
  StepStats s;
  s.found_inf = true;
  s.grad_max_abs = std::numeric_limits<double>::infinity();
  return s;
}

// Runs `found_inf` through a scaler; returns the scale after each update.
std::vector<double> run(LossScaler& scaler, const std::vector<int>& found_inf) {
  std::vector<double> after;
  for (int f : found_inf) {
    scaler.update(f ? overflow() : clean());
    after.push_back(scaler.scale());
  }
  return after;
}

// The message of the std::exception `f` throws, or "(no exception)".
template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

nlohmann::json golden() {
  std::ifstream in(kGoldenFile);
  BOOST_REQUIRE_MESSAGE(in.good(), "cannot read " << kGoldenFile);
  return nlohmann::json::parse(in);
}

std::string spec_default(const ampkit_plugin_descriptor& d, const std::string& name) {
  for (uint32_t i = 0; i < d.option_count; ++i)
    if (name == d.options[i].name) return d.options[i].default_value ? d.options[i].default_value : "";
  return "(no option " + name + ")";
}

bool is_power_of_two(double v) {
  int e = 0;
  return v > 0 && std::frexp(v, &e) == 0.5;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dynamic: GradScaler parity
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dynamic_defaults_are_gradscalers) {
  Plugins plugins;
  const nlohmann::json g = golden();
  const auto& d = plugins.plugin("scaler", "dynamic").descriptor();
  const auto& defaults = g.at("gradscaler_defaults");
  BOOST_TEST(std::stod(spec_default(d, "init_scale")) == defaults.at("init_scale").get<double>());
  BOOST_TEST(std::stod(spec_default(d, "growth_factor")) == defaults.at("growth_factor").get<double>());
  BOOST_TEST(std::stod(spec_default(d, "backoff_factor")) == defaults.at("backoff_factor").get<double>());
  BOOST_TEST(std::stoll(spec_default(d, "growth_interval")) == defaults.at("growth_interval").get<int64_t>());
  BOOST_TEST(spec_default(d, "hysteresis") == "1");  // 1 is GradScaler's behaviour
  BOOST_TEST(std::stod(spec_default(d, "max_scale")) ==
             static_cast<double>(std::numeric_limits<float>::max()));
  auto scaler = plugins.make("scaler", "dynamic");
  BOOST_TEST(as_scaler(scaler).scale() == 65536.0);
  BOOST_TEST(as_scaler(scaler).is_dynamic());
}

BOOST_AUTO_TEST_CASE(dynamic_reproduces_every_gradscaler_sequence) {
  Plugins plugins;
  const nlohmann::json g = golden();
  const auto& patterns = g.at("patterns");
  // A truncated or regenerated-with-fewer-patterns file must not pass silently.
  BOOST_TEST(patterns.size() == 10u);
  size_t steps_checked = 0;
  for (const auto& p : patterns) {
    const std::string name = p.at("name");
    std::map<std::string, std::string> options;
    for (const auto& [k, v] : p.at("options").items())
      options[k] = v.is_number_integer() ? std::to_string(v.get<int64_t>()) : text(v.get<double>());
    for (const auto& [k, v] : p.at("ampkit_options").items()) options[k] = text(v.get<double>());
    auto made = plugins.make("scaler", "dynamic", options);
    LossScaler& scaler = as_scaler(made);
    const auto& found = p.at("found_inf");
    const auto& used = p.at("scale");
    const auto& next = p.at("scale_next");
    const auto& tracker = p.at("growth_tracker");
    const size_t steps = p.at("steps").get<size_t>();
    BOOST_TEST_REQUIRE(found.size() == steps);
    size_t t = 0;
    for (; t < steps; ++t) {
      const bool ok_before = scaler.scale() == used[t].get<double>();
      StepStats stats = found[t].get<int>() ? overflow() : clean();
      stats.step = static_cast<int64_t>(t);
      stats.scale = scaler.scale();
      scaler.update(stats);
      const bool ok_after = scaler.scale() == next[t].get<double>();
      const bool ok_tracker = scaler.save().get<int64_t>("growth_tracker") == tracker[t].get<int64_t>();
      if (!(ok_before && ok_after && ok_tracker)) {
        BOOST_TEST_CONTEXT("pattern " << name << ", step " << t) {
          BOOST_TEST(stats.scale == used[t].get<double>());
          BOOST_TEST(scaler.scale() == next[t].get<double>());
          BOOST_TEST(scaler.save().get<int64_t>("growth_tracker") == tracker[t].get<int64_t>());
        }
        break;
      }
    }
    BOOST_TEST_CONTEXT("pattern " << name) {
      BOOST_TEST(t == steps);
    }
    steps_checked += t;
  }
  BOOST_TEST(steps_checked == 4100u + 24 + 40 + 200 + 14 + 8 + 6 + 60 + 80 + 30);
}

BOOST_AUTO_TEST_CASE(dynamic_default_floor_stops_gradscalers_fall_below_one) {
  // GradScaler goes from 4 to 2**-10 in twelve overflows (golden pattern backoff_below_one);
  // ampkit's default min_scale 1 stops at 1, then clamps or stops the run.
  Plugins plugins;
  auto clamp = plugins.make("scaler", "dynamic", {{"init_scale", "4"}, {"on_min_scale", "clamp"}});
  const std::vector<double> expected = {2, 1, 1, 1, 1};
  BOOST_TEST(run(as_scaler(clamp), {1, 1, 1, 1, 1}) == expected, boost::test_tools::per_element());

  auto error = plugins.make("scaler", "dynamic", {{"init_scale", "4"}});  // on_min_scale=error is the default
  LossScaler& s = as_scaler(error);
  s.update(overflow());
  s.update(overflow());
  BOOST_TEST(s.scale() == 1.0);  // reaching the floor is allowed ...
  const std::string message = thrown_message([&] { s.update(overflow()); });  // ... overflowing there is not
  BOOST_TEST(contains(message, "loss is probably exploding"), message);
  BOOST_TEST(contains(message, "min_scale"), message);
  BOOST_TEST(std::string(thrown_message([&] { s.update(overflow()); })) == message);
}

// ---------------------------------------------------------------------------------------------
// dynamic: Megatron-LM's hysteresis and min_scale
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dynamic_hysteresis_follows_megatron) {
  Plugins plugins;
  auto made = plugins.make("scaler", "dynamic",
                           {{"init_scale", "1024"}, {"hysteresis", "2"}, {"growth_interval", "3"}});
  LossScaler& s = as_scaler(made);
  // Megatron's DynamicGradScaler.update: an overflow zeroes the growth tracker and spends one unit
  // of hysteresis, backing off once it is spent; clean steps do NOT restore it (step 1), only a
  // growth does (step 6). Once spent, every overflow backs off (step 3).
  const std::vector<int> found = {1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0};
  const std::vector<double> scale = {1024, 1024, 512, 256, 256, 256, 512, 512, 256, 256, 256, 512};
  const std::vector<int64_t> hysteresis = {1, 1, 0, 0, 0, 0, 2, 1, 0, 0, 0, 2};
  const std::vector<int64_t> growth = {0, 1, 0, 0, 1, 2, 0, 0, 0, 1, 2, 0};
  std::vector<double> got_scale;
  std::vector<int64_t> got_hysteresis, got_growth;
  for (int f : found) {
    s.update(f ? overflow() : clean());
    got_scale.push_back(s.scale());
    got_hysteresis.push_back(s.save().get<int64_t>("hysteresis_tracker"));
    got_growth.push_back(s.save().get<int64_t>("growth_tracker"));
  }
  BOOST_TEST(got_scale == scale, boost::test_tools::per_element());
  BOOST_TEST(got_hysteresis == hysteresis, boost::test_tools::per_element());
  BOOST_TEST(got_growth == growth, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(dynamic_min_scale_is_megatrons_max_of_backoff_and_floor) {
  Plugins plugins;
  // max(scale * backoff, min_scale): 6 -> 3 -> max(1.5, 2) = 2 -> 2; growth resumes from the floor.
  auto clamp = plugins.make(
      "scaler", "dynamic",
      {{"init_scale", "6"}, {"min_scale", "2"}, {"growth_interval", "2"}, {"on_min_scale", "clamp"}});
  const std::vector<double> expected = {3, 2, 2, 2, 2, 4, 4, 8};
  BOOST_TEST(run(as_scaler(clamp), {1, 1, 1, 1, 0, 0, 0, 0}) == expected, boost::test_tools::per_element());

  // With hysteresis the floor holds too, and `error` waits until a backoff is actually due.
  auto error =
      plugins.make("scaler", "dynamic", {{"init_scale", "4"}, {"min_scale", "2"}, {"hysteresis", "2"}});
  LossScaler& e = as_scaler(error);
  BOOST_TEST(run(e, {1, 1}) == std::vector<double>({4, 2}), boost::test_tools::per_element());
  const std::string message = thrown_message([&] { e.update(overflow()); });
  BOOST_TEST(contains(message, "loss is probably exploding"), message);
  BOOST_TEST(contains(message, "minimum loss scale 2"), message);
}

BOOST_AUTO_TEST_CASE(dynamic_max_scale_caps_growth) {
  Plugins plugins;
  auto made = plugins.make("scaler", "dynamic",
                           {{"init_scale", "4096"}, {"max_scale", "10000"}, {"growth_interval", "1"}});
  const std::vector<double> expected = {8192, 10000, 10000, 5000, 10000};
  BOOST_TEST(run(as_scaler(made), {0, 0, 0, 1, 0}) == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(dynamic_backoff_request_applies_one_backoff) {
  Plugins plugins;
  auto made = plugins.make("scaler", "dynamic",
                           {{"init_scale", "1024"}, {"hysteresis", "3"}, {"growth_interval", "4"}});
  LossScaler& s = as_scaler(made);
  run(s, {0, 0, 0});
  BOOST_TEST(s.save().get<int64_t>("growth_tracker") == 3);
  s.backoff();  // a NaN policy's skip_backoff: hysteresis does not delay it
  BOOST_TEST(s.scale() == 512.0);
  BOOST_TEST(s.save().get<int64_t>("growth_tracker") == 0);
  BOOST_TEST(s.save().get<int64_t>("hysteresis_tracker") == 3);
  // Growth now waits a full interval again.
  BOOST_TEST(run(s, {0, 0, 0, 0}) == std::vector<double>({512, 512, 512, 1024}),
             boost::test_tools::per_element());
}

// growth_delay (DeepSpeed 0.17.1 counts one more clean step): the count starts at -growth_delay and
// restarts there after an overflow or an extra backoff, but at 0 after a growth. growth_interval 3,
// growth_delay 1: growths after the 4th and the 7th clean step, and after the 4th one following an
// overflow; growth_delay 0 is GradScaler's 3rd and 6th.
BOOST_AUTO_TEST_CASE(dynamic_growth_delay_counts_extra_clean_steps_before_growing) {
  Plugins plugins;
  const std::vector<int> found = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
  auto delayed = plugins.make("scaler", "dynamic",
                              {{"init_scale", "1024"}, {"growth_interval", "3"}, {"growth_delay", "1"}});
  LossScaler& s = as_scaler(delayed);
  BOOST_TEST(s.save().get<int64_t>("growth_tracker") == -1);
  std::vector<double> got_scale;
  std::vector<int64_t> got_growth;
  for (int f : found) {
    s.update(f ? overflow() : clean());
    got_scale.push_back(s.scale());
    got_growth.push_back(s.save().get<int64_t>("growth_tracker"));
  }
  const std::vector<double> scale = {1024, 1024, 1024, 2048, 2048, 2048, 4096, 2048, 2048, 2048, 2048, 4096};
  const std::vector<int64_t> growth = {0, 1, 2, 0, 1, 2, 0, -1, 0, 1, 2, 0};
  BOOST_TEST(got_scale == scale, boost::test_tools::per_element());
  BOOST_TEST(got_growth == growth, boost::test_tools::per_element());
  auto plain = plugins.make("scaler", "dynamic", {{"init_scale", "1024"}, {"growth_interval", "3"}});
  const std::vector<double> gradscaler = {1024, 1024, 2048, 2048, 2048, 4096,
                                          4096, 2048, 2048, 2048, 4096, 4096};
  BOOST_TEST(run(as_scaler(plain), found) == gradscaler, boost::test_tools::per_element());
  // A NaN policy's extra backoff restarts the count at -1 too: four clean steps to the next growth.
  s.backoff();
  BOOST_TEST(s.scale() == 2048.0);
  BOOST_TEST(s.save().get<int64_t>("growth_tracker") == -1);
  BOOST_TEST(run(s, {0, 0, 0, 0}) == std::vector<double>({2048, 2048, 2048, 4096}),
             boost::test_tools::per_element());
  // A checkpoint's tracker may be -growth_delay, no lower; a negative delay is refused.
  auto fresh = plugins.make("scaler", "dynamic",
                            {{"init_scale", "1024"}, {"growth_interval", "3"}, {"growth_delay", "1"}});
  State state = s.save();
  state.set("growth_tracker", int64_t{-1});
  as_scaler(fresh).load(state);
  BOOST_TEST(run(as_scaler(fresh), {0, 0, 0, 0}) == std::vector<double>({4096, 4096, 4096, 8192}),
             boost::test_tools::per_element());
  state.set("growth_tracker", int64_t{-2});
  BOOST_TEST(thrown_message([&] { as_scaler(fresh).load(state); }) ==
             "scaler 'dynamic': checkpoint growth_tracker -2 is outside [-1, 2] for "
             "scaler.growth_interval=3, scaler.growth_delay=1");
  BOOST_TEST(contains(thrown_message([&] {
                        plugins.make("scaler", "dynamic", {{"growth_delay", "-1"}});
                      }),
                      "growth_delay"));
}

// ---------------------------------------------------------------------------------------------
// dynamic: save / load
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dynamic_save_load_continues_identically) {
  Plugins plugins;
  const std::map<std::string, std::string> options = {{"init_scale", "12345"},
                                                      {"growth_factor", "1.7"},
                                                      {"backoff_factor", "0.3"},
                                                      {"growth_interval", "3"},
                                                      {"hysteresis", "2"}};
  std::vector<int> found;
  for (int t = 0; t < 80; ++t) found.push_back(t % 11 == 4 || t % 17 == 5 || t == 40 ? 1 : 0);

  auto whole = plugins.make("scaler", "dynamic", options);
  const std::vector<double> expected = run(as_scaler(whole), found);

  // Split after step 28 (two clean steps counted, one unit of hysteresis spent: the next clean
  // step grows) and after step 37 (the overflow at 39 backs off at once): a fresh scaler would
  // differ at both, so both trackers must travel.
  for (const auto& [split, growth, hysteresis] :
       {std::tuple<size_t, int64_t, int64_t>{29, 2, 1}, std::tuple<size_t, int64_t, int64_t>{38, 0, 1}}) {
    BOOST_TEST_CONTEXT("split at " << split) {
      auto first = plugins.make("scaler", "dynamic", options);
      std::vector<double> got = run(as_scaler(first), std::vector<int>(found.begin(), found.begin() + split));
      const State saved = as_scaler(first).save();
      BOOST_TEST(saved.values().size() == 3u);
      BOOST_TEST(saved.get<int64_t>("growth_tracker") == growth);
      BOOST_TEST(saved.get<int64_t>("hysteresis_tracker") == hysteresis);
      auto second = plugins.make("scaler", "dynamic", options);
      as_scaler(second).load(saved);
      BOOST_TEST(as_scaler(second).save() == saved);
      BOOST_TEST(as_scaler(second).scale() == as_scaler(first).scale());
      const std::vector<double> rest =
          run(as_scaler(second), std::vector<int>(found.begin() + split, found.end()));
      got.insert(got.end(), rest.begin(), rest.end());
      BOOST_TEST(got == expected, boost::test_tools::per_element());
      BOOST_TEST(as_scaler(second).save() == as_scaler(whole).save());
    }
  }
}

BOOST_AUTO_TEST_CASE(dynamic_load_refuses_bad_state) {
  Plugins plugins;
  auto made = plugins.make("scaler", "dynamic", {{"growth_interval", "10"}, {"hysteresis", "2"}});
  LossScaler& s = as_scaler(made);
  auto state = [](double scale, int64_t growth, int64_t hysteresis) {
    State st;
    st.set("scale", scale);
    st.set("growth_tracker", growth);
    st.set("hysteresis_tracker", hysteresis);
    return st;
  };
  BOOST_TEST(contains(thrown_message([&] { s.load(state(-2.0, 0, 2)); }), "positive finite float32"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(std::nan(""), 0, 2)); }), "positive finite float32"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(INFINITY, 0, 2)); }), "positive finite float32"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(0.1, 0, 2)); }), "float32"));    // no float32 is 0.1
  BOOST_TEST(contains(thrown_message([&] { s.load(state(0.5, 0, 2)); }), "min_scale"));  // below the floor 1
  BOOST_TEST(
      contains(thrown_message([&] { s.load(state(1024, 10, 2)); }), "growth_tracker 10 is outside [0, 9]"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1024, -1, 2)); }), "growth_tracker"));
  BOOST_TEST(
      contains(thrown_message([&] { s.load(state(1024, 0, 3)); }), "hysteresis_tracker 3 is outside [0, 2]"));
  State wrong_type;
  wrong_type.set("scale", int64_t{1024});
  wrong_type.set("growth_tracker", int64_t{0});
  wrong_type.set("hysteresis_tracker", int64_t{2});
  BOOST_TEST(contains(thrown_message([&] { s.load(wrong_type); }), "'scale' has another type"));
  State missing;
  missing.set("scale", 1024.0);
  BOOST_TEST(contains(thrown_message([&] { s.load(missing); }), "no key 'growth_tracker'"));
  // Nothing of a refused state was taken.
  BOOST_TEST(s.scale() == 65536.0);
  s.load(state(2048.0, 9, 1));
  BOOST_TEST(s.scale() == 2048.0);
  s.update(clean());  // the tenth clean step grows
  BOOST_TEST(s.scale() == 4096.0);
}

// ---------------------------------------------------------------------------------------------
// Options refused with a message naming the option
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_the_option_named) {
  Plugins plugins;
  struct Case {
    std::string scaler;
    std::map<std::string, std::string> options;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"dynamic", {{"growth_factor", "0.5"}}, {"'growth_factor'", "> 1", "0.5"}},
      {"dynamic", {{"growth_factor", "1"}}, {"'growth_factor'", "> 1"}},
      {"dynamic", {{"backoff_factor", "1.5"}}, {"'backoff_factor'", "(0, 1)", "1.5"}},
      {"dynamic", {{"backoff_factor", "0"}}, {"'backoff_factor'", "(0, 1)"}},
      {"dynamic", {{"growth_interval", "0"}}, {"'growth_interval'", ">= 1"}},
      {"dynamic", {{"hysteresis", "0"}}, {"'hysteresis'", ">= 1"}},
      {"dynamic", {{"init_scale", "1e39"}}, {"'init_scale'"}},
      {"dynamic", {{"on_min_scale", "ignore"}}, {"'on_min_scale'", "error|clamp"}},
      // Cross-option checks happen in the constructor; the factory's message reaches the user.
      {"dynamic", {{"min_scale", "131072"}}, {"'min_scale'", "<= init_scale (65536)", "131072"}},
      {"dynamic", {{"max_scale", "1024"}}, {"'max_scale'", ">= init_scale (65536)", "1024"}},
      {"predictive", {{"init_scale", "1000"}}, {"'init_scale'", "power of two", "1000"}},
      {"predictive", {{"min_scale", "2048"}}, {"'min_scale'", "<= init_scale (1024)"}},
      {"predictive", {{"max_scale", "3e6"}}, {"'max_scale'", "power of two"}},
      {"predictive", {{"margin", "0.5"}}, {"'margin'", "0.5"}},
      {"predictive", {{"max_growth", "1.5"}}, {"'max_growth'", ">= 2"}},
      {"predictive", {{"backoff_factor", "1.5"}}, {"'backoff_factor'", "1.5"}},
      {"predictive", {{"history", "0"}}, {"'history'"}},
  };
  for (const auto& c : cases) {
    std::string message = "(no exception)";
    try {
      plugins.make("scaler", c.scaler, c.options);
    } catch (const Error& e) {
      message = e.what();
      BOOST_TEST((e.category() == ErrorCategory::usage || e.category() == ErrorCategory::plugin));
    }
    for (const auto& part : c.expect)
      BOOST_TEST_CONTEXT(c.scaler << " " << c.options.begin()->first << "=" << c.options.begin()->second) {
        BOOST_TEST(contains(message, part), "'" << part << "' in: " << message);
      }
  }
}

BOOST_AUTO_TEST_CASE(constructors_check_ranges_without_the_host) {
  // A host that builds OptionValues itself skips the registry's range checks: the constructor
  // must still refuse (std::invalid_argument, reported by the factory as a plugin error).
  Plugins plugins;
  struct Case {
    std::string scaler, option, value, expect;
  };
  const std::vector<Case> cases = {
      {"dynamic", "growth_factor", "0.5", "option 'growth_factor' of scaler 'dynamic' must be > 1"},
      {"dynamic", "backoff_factor", "1.5", "option 'backoff_factor' of scaler 'dynamic' must be in (0, 1)"},
      {"dynamic", "growth_interval", "0", "option 'growth_interval' of scaler 'dynamic' must be >= 1"},
      {"dynamic", "min_scale", "-1", "option 'min_scale' of scaler 'dynamic' must be in (0, "},
      {"predictive", "growth_margin", "0.5", "option 'growth_margin' of scaler 'predictive' must be >= 1"},
      {"predictive", "history", "0", "option 'history' of scaler 'predictive' must be in [1, 65536]"},
  };
  for (const auto& c : cases) {
    const LoadedPlugin& p = plugins.plugin("scaler", c.scaler);
    OptionInputs in;
    in.read_environment = false;
    OptionValues values = resolve_options(p.descriptor(), in).values;
    values.set(c.option, c.value);
    std::string message = "(no exception)";
    try {
      p.create(values);
    } catch (const Error& e) {
      message = e.what();
      BOOST_TEST((e.category() == ErrorCategory::plugin));
    }
    BOOST_TEST_CONTEXT(c.scaler << " " << c.option << "=" << c.value) {
      BOOST_TEST(contains(message, c.expect), message);
      BOOST_TEST(contains(message, c.value), message);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// predictive
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(predictive_default_margin_keeps_the_scale_seven_binades_under_the_limit) {
  // Defaults: max |g| 0.01, growth_margin 2: predicted 0.02; room 65504 / margin 64 = 1023.5;
  // 1023.5 / 0.02 = 51175 -> 2^15, reached from init_scale 1024 in 5 steps of x2.
  Plugins plugins;
  auto made = plugins.make("scaler", "predictive");
  LossScaler& s = as_scaler(made);
  std::vector<double> got;
  for (int i = 0; i < 7; ++i) {
    s.update(clean(0.01));
    got.push_back(s.scale());
  }
  BOOST_TEST(got == std::vector<double>({2048, 4096, 8192, 16384, 32768, 32768, 32768}),
             boost::test_tools::per_element());
}

// The cases below pin margin 8 so that their arithmetic stays small; the default is 64.
BOOST_AUTO_TEST_CASE(predictive_climbs_by_powers_of_two_to_the_predicted_scale) {
  Plugins plugins;
  auto made = plugins.make("scaler", "predictive", {{"margin", "8"}});
  LossScaler& s = as_scaler(made);
  BOOST_TEST(s.is_dynamic());
  BOOST_TEST(s.scale() == 1024.0);  // init_scale: nothing measured yet
  // max |g| 0.01, growth_margin 2: predicted 0.02; room 65504 / margin 8 = 8188;
  // 8188 / 0.02 = 409400 -> 2^18. Growth is at most x2 per step.
  std::vector<double> got;
  for (int i = 0; i < 10; ++i) {
    s.update(clean(0.01));
    got.push_back(s.scale());
  }
  BOOST_TEST(
      got == std::vector<double>({2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 262144, 262144}),
      boost::test_tools::per_element());
  // Larger gradients lower the scale at once: 8188 / 0.04 = 204700 -> 2^17.
  s.update(clean(0.02));
  BOOST_TEST(s.scale() == 131072.0);
  // A finite spike: 8188 / (0.3 * 2) = 13647 -> 8192 for as long as the spike is in the 16-step
  // history (15 more steps), then x2 per step back to 2^18 (the 0.02 left the history first).
  s.update(clean(0.3));
  BOOST_TEST(s.scale() == 8192.0);
  got.clear();
  for (int i = 0; i < 20; ++i) {
    s.update(clean(0.01));
    got.push_back(s.scale());
  }
  std::vector<double> expected(15, 8192.0);
  for (double v : {16384.0, 32768.0, 65536.0, 131072.0, 262144.0}) expected.push_back(v);
  BOOST_TEST(got == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(predictive_never_overflows_where_dynamic_does) {
  // Gradient maxima rise 3% per step, then jump by 1.9x (less than growth_margin 2): a sequence
  // the prediction covers. The largest fp16 value in the backward is modelled as 4x the
  // parameter-gradient maximum (activation gradients), under margin 8.
  std::vector<double> maxima;
  for (int t = 0; t < 400; ++t) maxima.push_back(1e-3 * std::pow(1.03, t));
  for (int t = 0; t < 30; ++t) maxima.push_back(maxima[399] * 1.9);
  const double activation_ratio = 4.0;

  Plugins plugins;
  auto dynamic = plugins.make("scaler", "dynamic");
  auto predictive = plugins.make("scaler", "predictive", {{"margin", "8"}});
  std::map<std::string, int> overflows;
  for (auto* entry : {&dynamic, &predictive}) {
    LossScaler& s = as_scaler(*entry);
    const std::string name = entry == &dynamic ? "dynamic" : "predictive";
    int count = 0;
    for (double m : maxima) {
      const double used = s.scale();
      if (name == "predictive") {
        BOOST_TEST(is_power_of_two(used));
        BOOST_TEST((used >= 1.0 && used <= 16777216.0));
      }
      if (m * activation_ratio * used > 65504.0) {
        ++count;
        s.update(overflow());
      } else {
        s.update(clean(m));
      }
    }
    overflows[name] = count;
  }
  BOOST_TEST(overflows["predictive"] == 0);
  // Maxima grow from 1e-3 to 252 (2^18); dynamic halves, one overflow at a time, from 2^16 to
  // 2^6, the largest scale with 252 * 4 * scale <= 65504: ten overflows (no growth in 430 steps).
  BOOST_TEST(overflows["dynamic"] == 10);
  BOOST_TEST(as_scaler(dynamic).scale() == 64.0);
  // The predictive scale ends where the prediction puts it: 8188 / (2 * 252) = 16.2 -> 16.
  BOOST_TEST(as_scaler(predictive).scale() == 16.0);
}

BOOST_AUTO_TEST_CASE(predictive_backs_off_on_a_real_overflow_and_keeps_its_history) {
  Plugins plugins;
  auto made = plugins.make("scaler", "predictive", {{"margin", "8"}});
  LossScaler& s = as_scaler(made);
  for (int i = 0; i < 20; ++i) s.update(clean(0.01));
  BOOST_TEST(s.scale() == 262144.0);
  const std::vector<double> history = s.save().get<std::vector<double>>("history");
  BOOST_TEST(history == std::vector<double>(16, 0.01), boost::test_tools::per_element());

  s.update(overflow());  // what the history could not see
  BOOST_TEST(s.scale() == 131072.0);
  BOOST_TEST(s.save().get<std::vector<double>>("history") == history, boost::test_tools::per_element());
  BOOST_TEST(s.save().get<int64_t>("cooldown_left") == 100);
  // The prediction still says 2^18, but the scale stays at the backed-off value for
  // overflow_cooldown = 100 clean steps; the 100th lifts the ceiling.
  std::vector<double> got;
  for (int i = 0; i < 101; ++i) {
    s.update(clean(0.01));
    got.push_back(s.scale());
  }
  std::vector<double> expected(99, 131072.0);
  expected.push_back(262144.0);
  expected.push_back(262144.0);
  BOOST_TEST(got == expected, boost::test_tools::per_element());

  // A NaN policy's backoff request behaves like an overflow.
  s.backoff();
  BOOST_TEST(s.scale() == 131072.0);
  BOOST_TEST(s.save().get<int64_t>("cooldown_left") == 100);
}

BOOST_AUTO_TEST_CASE(predictive_min_scale_clamps_or_stops) {
  Plugins plugins;
  auto error = plugins.make("scaler", "predictive", {{"init_scale", "2"}});
  LossScaler& e = as_scaler(error);
  e.update(overflow());
  BOOST_TEST(e.scale() == 1.0);
  const std::string message = thrown_message([&] { e.update(overflow()); });
  BOOST_TEST(contains(message, "loss is probably exploding"), message);

  auto clamp = plugins.make("scaler", "predictive", {{"init_scale", "2"}, {"on_min_scale", "clamp"}});
  LossScaler& c = as_scaler(clamp);
  for (int i = 0; i < 3; ++i) c.update(overflow());
  BOOST_TEST(c.scale() == 1.0);
  // A prediction below the floor (65504 / 64 / (2 * 5000) < 1) holds the floor, it does not throw.
  c.update(clean(5000.0));
  BOOST_TEST(c.scale() == 1.0);
}

BOOST_AUTO_TEST_CASE(predictive_save_load_continues_identically) {
  Plugins plugins;
  const std::map<std::string, std::string> options = {{"history", "8"}, {"overflow_cooldown", "5"}};
  // Maxima that wander over two decades, with overflows: the ring buffer wraps several times
  // and a cooldown is running at the save point.
  std::vector<double> maxima;
  for (int t = 0; t < 90; ++t)
    maxima.push_back(t % 23 == 20 ? INFINITY : 1e-3 * std::pow(10.0, std::sin(t * 0.37) + 1.0));
  maxima[44] =
      5.0;  // a spike just before the save: a resumed scaler that forgot it would pick a larger scale
  auto drive = [&](LossScaler& s, size_t from, size_t to) {
    std::vector<double> scales;
    for (size_t t = from; t < to; ++t) {
      s.update(std::isfinite(maxima[t]) ? clean(maxima[t]) : overflow());
      scales.push_back(s.scale());
    }
    return scales;
  };
  auto whole = plugins.make("scaler", "predictive", options);
  const std::vector<double> expected = drive(as_scaler(whole), 0, maxima.size());

  auto first = plugins.make("scaler", "predictive", options);
  std::vector<double> got = drive(as_scaler(first), 0, 45);  // overflow at t = 43, clean at 44
  const State saved = as_scaler(first).save();
  BOOST_TEST(saved.get<int64_t>("cooldown_left") == 4);
  BOOST_TEST(saved.get<std::vector<double>>("history").size() == 8u);
  // Oldest first: the last 8 finite maxima before the save.
  std::vector<double> last8;
  for (size_t t = 0; t < 45; ++t)
    if (std::isfinite(maxima[t])) last8.push_back(maxima[t]);
  last8.erase(last8.begin(), last8.end() - 8);
  BOOST_TEST(saved.get<std::vector<double>>("history") == last8, boost::test_tools::per_element());

  auto second = plugins.make("scaler", "predictive", options);
  as_scaler(second).load(saved);
  BOOST_TEST(as_scaler(second).save() == saved);
  const std::vector<double> rest = drive(as_scaler(second), 45, maxima.size());
  got.insert(got.end(), rest.begin(), rest.end());
  BOOST_TEST(got == expected, boost::test_tools::per_element());
  BOOST_TEST(as_scaler(second).save() == as_scaler(whole).save());
  // The sequence really moved (else this would prove little): several distinct powers of two.
  std::set<double> distinct(expected.begin(), expected.end());
  BOOST_TEST(distinct.size() >= 4u);
  for (double v : expected) BOOST_TEST(is_power_of_two(v));
}

BOOST_AUTO_TEST_CASE(predictive_load_validates_and_trims_history) {
  Plugins plugins;
  auto made = plugins.make("scaler", "predictive", {{"history", "4"}, {"margin", "8"}});
  LossScaler& s = as_scaler(made);
  auto state = [](double scale, std::vector<double> history, int64_t cooldown = 0,
                  double ceiling = 16777216.0) {
    State st;
    st.set("scale", scale);
    st.set("ceiling", ceiling);
    st.set("cooldown_left", cooldown);
    st.set("history", std::move(history));
    return st;
  };
  BOOST_TEST(contains(thrown_message([&] { s.load(state(3000, {0.1})); }), "not a power of two"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(-4, {0.1})); }), "not a power of two"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1 << 25, {0.1})); }), "scaler.max_scale"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1024, {0.1, NAN})); }), "history holds nan"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1024, {-0.1})); }), "history holds -0.1"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1024, {0.1}, 101)); }), "cooldown_left 101"));
  BOOST_TEST(contains(thrown_message([&] { s.load(state(1024, {0.1}, 0, 1000)); }), "ceiling"));
  BOOST_TEST(s.scale() == 1024.0);
  // A history longer than this run's keeps the newest entries.
  s.load(state(4096, {9, 8, 7, 6, 5, 4}));
  BOOST_TEST(s.save().get<std::vector<double>>("history") == std::vector<double>({7, 6, 5, 4}),
             boost::test_tools::per_element());
  // 8188 / (2 * 7) = 585 -> 512: the remembered maximum is 7, not 9 (nor 1.0 alone: 4094 -> 2048).
  s.update(clean(1.0));
  BOOST_TEST(s.scale() == 512.0);
}

// ---------------------------------------------------------------------------------------------
// The scale inside the Trainer
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(trainer_uses_one_scale_per_step_and_updates_once_per_optimizer_step) {
  Plugins plugins;
  // growth_interval 1: every clean update doubles the scale, so an update per micro-batch
  // (4 per step) would show as x16 per step instead of x2.
  auto scaler = plugins.make("scaler", "dynamic", {{"init_scale", "1024"}, {"growth_interval", "1"}});
  auto clipper = plugins.make("clipper", "none");
  auto policy = plugins.make("nan_policy", "skip");
  auto comm = plugins.make("comm", "local");
  at::manual_seed(0);
  torch::nn::Linear layer(torch::nn::LinearOptions(8, 4));
  torch::optim::SGD opt({layer->weight, layer->bias}, torch::optim::SGDOptions(0.01));
  LrSchedule schedule;
  schedule.base_lr = 0.01;
  const int accumulate = 4;
  Trainer trainer(Precision::fp32, accumulate, {layer->weight, layer->bias}, {"weight", "bias"}, opt,
                  {static_cast<LossScaler*>(scaler.get()), static_cast<GradClipper*>(clipper.get()),
                   static_cast<NanPolicy*>(policy.get()), static_cast<CommBackend*>(comm.get())},
                  schedule);

  // NaN losses in one micro-batch of steps 2 and 3.
  const std::vector<int> nan_micro = {-1, -1, 1, 3, -1, -1};
  std::vector<std::vector<double>> backward_scales;  // what each micro-batch's backward really used
  std::vector<StepOutcome> outcomes;
  for (size_t step = 0; step < nan_micro.size(); ++step) {
    backward_scales.emplace_back();
    outcomes.push_back(trainer.step([&](int micro) {
      at::manual_seed(static_cast<int64_t>(step * 10 + micro));
      at::Tensor loss = layer->forward(at::randn({16, 8})).pow(2).mean();
      if (micro == nan_micro[step]) loss = loss * std::numeric_limits<float>::quiet_NaN();
      // The engine backpropagates loss * scale / accumulate: that is the gradient reaching the loss.
      loss.register_hook([&, step](const at::Tensor& grad) {
        backward_scales[step].push_back(grad.item<double>() * accumulate);
      });
      return loss;
    }));
  }
  const std::vector<double> used = {1024, 2048, 4096, 2048, 1024, 2048};
  const std::vector<double> next = {2048, 4096, 2048, 1024, 2048, 4096};
  for (size_t step = 0; step < used.size(); ++step) {
    BOOST_TEST_CONTEXT("step " << step) {
      BOOST_TEST(backward_scales[step] == std::vector<double>(accumulate, used[step]),
                 boost::test_tools::per_element());
      BOOST_TEST(outcomes[step].stats.scale == used[step]);
      BOOST_TEST(outcomes[step].scale_next == next[step]);
      BOOST_TEST(outcomes[step].stats.found_inf == (nan_micro[step] >= 0));
      BOOST_TEST(outcomes[step].stepped == (nan_micro[step] < 0));
    }
  }
  BOOST_TEST(trainer.steps_taken() == 4);
  BOOST_TEST(trainer.steps_skipped() == 2);
}

BOOST_AUTO_TEST_CASE(static_and_none_are_not_dynamic) {
  Plugins plugins;
  auto none = plugins.make("scaler", "none");
  auto fixed = plugins.make("scaler", "static", {{"scale", "4096"}});
  for (auto* s : {&as_scaler(none), &as_scaler(fixed)}) {
    const double before = s->scale();
    s->update(overflow());
    s->backoff();
    BOOST_TEST(s->scale() == before);
    BOOST_TEST(!s->is_dynamic());
  }
  BOOST_TEST(as_scaler(none).scale() == 1.0);
  BOOST_TEST(as_scaler(fixed).scale() == 4096.0);
}

// A checkpoint of another constant scale is refused naming the plugin and both scales as typed.
BOOST_AUTO_TEST_CASE(static_refuses_a_checkpoint_of_another_scale) {
  Plugins plugins;
  auto saved = plugins.make("scaler", "static", {{"scale", "1024"}});
  auto fixed = plugins.make("scaler", "static", {{"scale", "512"}});
  BOOST_TEST(thrown_message([&] { as_scaler(fixed).load(as_scaler(saved).save()); }) ==
             "scaler 'static': checkpoint was written with scaler.scale=1024 but this run uses 512");
}
