// Option resolution on the real static scaler and norm clipper: precedence, sources, and the
// errors a user gets for a misspelt option or a bad value from each source.
#include <ampkit/plugin_options.h>
#include <stdlib.h>

#include <boost/test/unit_test.hpp>
#include <map>
#include <string>

#include "registry_test_support.h"

using namespace ampkit_test;
using ampkit::ExitCode;
using ampkit::OptionInputs;
using ampkit::ResolvedOptions;

namespace {

// The descriptor of a real plugin; the registry (and the library) lives for the whole run.
const ampkit_plugin_descriptor& descriptor(const std::string& kind, const std::string& name) {
  static ampkit::Registry registry(only({kPluginDir}));
  return registry.load(registry.find(kind, name)).descriptor();
}

const ampkit::OptionSetting& setting(const ResolvedOptions& r, const std::string& name) {
  for (const auto& s : r.settings)
    if (s.name == name) return s;
  throw std::runtime_error("no setting '" + name + "'");
}

// Sets an environment variable for the life of the object, and unsets it after.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

OptionInputs inputs(std::map<std::string, std::string> command_line,
                    std::map<std::string, std::string> config_file = {}, bool environment = false) {
  OptionInputs in;
  in.command_line = std::move(command_line);
  in.config_file = std::move(config_file);
  in.config_file_name = "run.yaml";
  in.read_environment = environment;
  return in;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(options)

BOOST_AUTO_TEST_CASE(defaults_are_reported_as_defaults) {
  const auto scaler = ampkit::resolve_options(descriptor("scaler", "static"), inputs({}));
  BOOST_TEST_REQUIRE(scaler.settings.size() == 1u);
  BOOST_TEST(setting(scaler, "scale").value == "1024");
  BOOST_TEST(setting(scaler, "scale").source == "default");
  BOOST_TEST(setting(scaler, "scale").type == "float in (0, 3e+38]");
  BOOST_TEST(scaler.values.get_float("scale") == 1024.0);

  const auto clipper = ampkit::resolve_options(descriptor("clipper", "norm"), inputs({}));
  BOOST_TEST_REQUIRE(clipper.settings.size() == 2u);
  // max_norm has no default: it stays unset and the plugin derives it from the precision.
  BOOST_TEST(!setting(clipper, "max_norm").set);
  BOOST_TEST(setting(clipper, "max_norm").source == "unset");
  BOOST_TEST(setting(clipper, "max_norm").type == "float > 0");
  BOOST_TEST(!clipper.values.has("max_norm"));
  BOOST_TEST(setting(clipper, "norm_type").value == "2");
  BOOST_TEST(setting(clipper, "norm_type").type == "choice 2|inf");
}

BOOST_AUTO_TEST_CASE(command_line_beats_environment_beats_config_file_beats_default) {
  const auto& d = descriptor("scaler", "static");
  const ScopedEnv env("AMPKIT_SCALER_SCALE", "256");

  auto r = ampkit::resolve_options(d, inputs({{"scale", "512"}}, {{"scale", "128"}}, true));
  BOOST_TEST(setting(r, "scale").value == "512");
  BOOST_TEST(setting(r, "scale").source == "command line");
  BOOST_TEST(r.values.get_float("scale") == 512.0);

  r = ampkit::resolve_options(d, inputs({}, {{"scale", "128"}}, true));
  BOOST_TEST(setting(r, "scale").value == "256");
  BOOST_TEST(setting(r, "scale").source == "environment AMPKIT_SCALER_SCALE");

  // Without read_environment the variable is ignored.
  r = ampkit::resolve_options(d, inputs({}, {{"scale", "128"}}, false));
  BOOST_TEST(setting(r, "scale").value == "128");
  BOOST_TEST(setting(r, "scale").source == "config file run.yaml");

  ::unsetenv("AMPKIT_SCALER_SCALE");
  r = ampkit::resolve_options(d, inputs({}, {{"scale", "128"}}, true));
  BOOST_TEST(setting(r, "scale").value == "128");
  BOOST_TEST(setting(r, "scale").source == "config file run.yaml");

  r = ampkit::resolve_options(d, inputs({}, {}, true));
  BOOST_TEST(setting(r, "scale").value == "1024");
  BOOST_TEST(setting(r, "scale").source == "default");
}

BOOST_AUTO_TEST_CASE(float_values_are_stored_in_shortest_form) {
  const auto r =
      ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", "6.5536e4"}}));
  BOOST_TEST(setting(r, "scale").value == "65536");
  BOOST_TEST(r.values.get_float("scale") == 65536.0);
}

BOOST_AUTO_TEST_CASE(unknown_option_suggests_the_right_one) {
  const auto& d = descriptor("scaler", "static");
  Caught e = catch_error([&] { ampkit::resolve_options(d, inputs({{"scael", "2"}})); });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "unknown option 'scael' for scaler 'static' (from command line)");
  AMPKIT_CHECK_CONTAINS(e.message, "did you mean 'scale'?");
  AMPKIT_CHECK_CONTAINS(e.message, "options: scale");

  e = catch_error([&] { ampkit::resolve_options(d, inputs({}, {{"scales", "2"}})); });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "unknown option 'scales' for scaler 'static' (from config file run.yaml)");
  AMPKIT_CHECK_CONTAINS(e.message, "did you mean 'scale'?");
}

BOOST_AUTO_TEST_CASE(text_for_a_float_is_refused) {
  const Caught e = catch_error([&] {
    ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", "abc"}}));
  });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'scale' of scaler 'static' must be a finite number, "
                        "got 'abc' (from command line)");
}

BOOST_AUTO_TEST_CASE(non_finite_float_is_refused) {
  for (const char* text : {"inf", "nan", "1e999"}) {
    BOOST_TEST_CONTEXT("scale=" << text) {
      const Caught e = catch_error([&] {
        ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", text}}));
      });
      AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
      AMPKIT_CHECK_CONTAINS(e.message, "must be a finite number");
    }
  }
}

BOOST_AUTO_TEST_CASE(value_outside_the_range_is_refused_with_the_range) {
  const auto& d = descriptor("scaler", "static");
  // The minimum 0 is exclusive: 0 and below are refused, anything above is accepted.
  for (const char* text : {"0", "-1", "4e38"}) {
    BOOST_TEST_CONTEXT("scale=" << text) {
      const Caught e = catch_error([&] { ampkit::resolve_options(d, inputs({{"scale", text}})); });
      AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
      AMPKIT_CHECK_CONTAINS(e.message,
                            "option 'scale' of scaler 'static' must be float in (0, 3e+38], got '" +
                                std::string(text) + "' (from command line)");
    }
  }
  const auto r = ampkit::resolve_options(d, inputs({{"scale", "1e-30"}}));
  BOOST_TEST(r.values.get_float("scale") == 1e-30);
}

BOOST_AUTO_TEST_CASE(value_outside_the_choices_is_refused_with_the_choices) {
  const auto& d = descriptor("clipper", "norm");
  const Caught e = catch_error([&] {
    ampkit::resolve_options(d, inputs({}, {{"norm_type", "3"}}));
  });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'norm_type' of clipper 'norm' must be one of 2|inf, got '3' "
                        "(from config file run.yaml)");
  const auto r = ampkit::resolve_options(d, inputs({{"norm_type", "inf"}}));
  BOOST_TEST(r.values.get_string("norm_type") == "inf");
}

BOOST_AUTO_TEST_CASE(misspelt_environment_variable_is_an_error) {
  const ScopedEnv env("AMPKIT_SCALER_SCLAE", "2");
  const Caught e = catch_error(
      [&] { ampkit::resolve_options(descriptor("scaler", "static"), inputs({}, {}, true)); });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "unknown option 'sclae' for scaler 'static' "
                        "(from environment AMPKIT_SCALER_SCLAE)");
  AMPKIT_CHECK_CONTAINS(e.message, "did you mean 'scale'?");
  // Variables of another kind are not this plugin's business.
  const auto r = ampkit::resolve_options(descriptor("clipper", "norm"), inputs({}, {}, true));
  BOOST_TEST(setting(r, "norm_type").source == "default");
}

BOOST_AUTO_TEST_CASE(bad_value_from_the_environment_names_the_variable) {
  const ScopedEnv env("AMPKIT_CLIPPER_MAX_NORM", "-1");
  const Caught e = catch_error(
      [&] { ampkit::resolve_options(descriptor("clipper", "norm"), inputs({}, {}, true)); });
  AMPKIT_REQUIRE_ERROR(e, ExitCode::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'max_norm' of clipper 'norm' must be float > 0, got '-1' "
                        "(from environment AMPKIT_CLIPPER_MAX_NORM)");
}

BOOST_AUTO_TEST_CASE(environment_names_are_upper_case_kind_and_option) {
  BOOST_TEST(ampkit::option_environment_name("nan_policy", "max_consecutive") ==
             "AMPKIT_NAN_POLICY_MAX_CONSECUTIVE");
  BOOST_TEST(ampkit::option_environment_name("scaler", "scale") == "AMPKIT_SCALER_SCALE");
}

BOOST_AUTO_TEST_SUITE_END()
