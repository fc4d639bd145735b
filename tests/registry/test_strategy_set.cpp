// StrategySet::reconfigure: a strategy made again with other options is made as create()
// makes it (a plugin call, guarded), keeps its state, and reports a failure inside it by plugin name.
#include <ampkit/loss_scaler.h>

#include <boost/test/unit_test.hpp>
#include <string>

#include "ampkit/error.h"
#include "builtin_plugins.h"

using namespace ampkit;
using ampkit::test::BuiltinPlugins;

BOOST_AUTO_TEST_SUITE(strategy_set)

BOOST_AUTO_TEST_CASE(reconfigure_keeps_the_state_and_the_guard) {
  BuiltinPlugins plugins;
  auto set = plugins.strategies({{"scaler", BuiltinPlugins::choice("static", {{"scale", "512"}})},
                                 {"clipper", BuiltinPlugins::choice("norm", {{"max_norm", "2"}})}});
  OptionInputs inputs;
  inputs.read_environment = false;
  inputs.command_line = {{"max_norm", "0.25"}};
  set->reconfigure("clipper", inputs, nullptr);
  StepStats stats;
  stats.grad_norm = 1.0;
  BOOST_TEST(set->clipper().clip(stats).threshold == 0.25);  // the new option is in force
  for (const auto& s : set->selected("clipper").options.settings)
    if (s.name == "max_norm") BOOST_TEST(s.value == "0.25");

  // The static scaler's load() refuses a state written with another scale: reconfiguring it to
  // scale 1024 hands the new strategy the old one's state (scale 512), which it refuses by name.
  OptionInputs other;
  other.read_environment = false;
  other.command_line = {{"scale", "1024"}};
  try {
    set->reconfigure("scaler", other, nullptr);
    BOOST_FAIL("the old state reached no load()");
  } catch (const Error& e) {
    BOOST_TEST((e.category() == ErrorCategory::plugin));
    const std::string what = e.what();
    BOOST_TEST(what.find("scaler 'static'") != std::string::npos, what);
    BOOST_TEST(what.find("load()") != std::string::npos, what);
    BOOST_TEST(what.find("scaler.scale=512") != std::string::npos, what);
  }
  BOOST_TEST(set->scaler().scale() == 512.0);  // the old strategy stays when the new one fails
}

BOOST_AUTO_TEST_SUITE_END()
