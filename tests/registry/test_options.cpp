// Option resolution on the real static scaler and norm clipper: precedence, sources, and the
// errors a user gets for a misspelt option or a bad value from each source.
#include <ampkit/grad_clipper.h>
#include <ampkit/plugin_options.h>
#include <ampkit/registry.h>
#include <ampkit/testing.h>
#include <stdlib.h>

#include <boost/test/unit_test.hpp>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "registry_test_support.h"

using namespace ampkit::test;
using ampkit::ErrorCategory;
using ampkit::OptionInputs;
using ampkit::ResolvedOptions;

namespace {

// The descriptor of a real plugin; the registry (and the library) lives for the whole run.
const ampkit::LoadedPlugin& plugin(const std::string& kind, const std::string& name) {
  static ampkit::Registry registry(only({kPluginDir}));
  return registry.load(registry.find(kind, name));
}
const ampkit_plugin_descriptor& descriptor(const std::string& kind, const std::string& name) {
  return plugin(kind, name).descriptor();
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
                    std::map<std::string, std::string> config_file = {}, bool environment = false,
                    std::optional<ampkit::Precision> precision = std::nullopt) {
  OptionInputs in;
  in.command_line = std::move(command_line);
  in.config_file = std::move(config_file);
  in.config_file_name = "run.yaml";
  in.read_environment = environment;
  in.precision = precision;
  return in;
}

// A descriptor with one per-precision float option "> 0", for defaults no real plugin declares.
struct PerPrecisionPlugin {
  ampkit_option_spec spec;
  ampkit_plugin_descriptor descriptor{};
  explicit PerPrecisionPlugin(const char* defaults)
      : spec(ampkit::OptionSpec::Float("limit", defaults, "A limit.").per_precision().min(0.0, true)) {
    descriptor.kind = "clipper";
    descriptor.name = "fake";
    descriptor.option_count = 1;
    descriptor.options = &spec;
  }
};

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
  // max_norm's default depends on the precision: without one it stays unset.
  BOOST_TEST(!setting(clipper, "max_norm").set);
  BOOST_TEST(setting(clipper, "max_norm").source == "unset");
  BOOST_TEST(setting(clipper, "max_norm").type == "float > 0");
  BOOST_TEST(setting(clipper, "max_norm").default_value == "fp16=1;bf16=5;fp32=10");
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
  const auto r = ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", "6.5536e4"}}));
  BOOST_TEST(setting(r, "scale").value == "65536");
  BOOST_TEST(r.values.get_float("scale") == 65536.0);
}

BOOST_AUTO_TEST_CASE(unknown_option_suggests_the_right_one) {
  const auto& d = descriptor("scaler", "static");
  Caught e = catch_error([&] { ampkit::resolve_options(d, inputs({{"scael", "2"}})); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message, "unknown option 'scael' for scaler 'static' (from command line)");
  AMPKIT_CHECK_CONTAINS(e.message, "did you mean 'scale'?");
  AMPKIT_CHECK_CONTAINS(e.message, "options: scale");

  e = catch_error([&] { ampkit::resolve_options(d, inputs({}, {{"scales", "2"}})); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message, "unknown option 'scales' for scaler 'static' (from config file run.yaml)");
  AMPKIT_CHECK_CONTAINS(e.message, "did you mean 'scale'?");
}

BOOST_AUTO_TEST_CASE(text_for_a_float_is_refused) {
  const Caught e = catch_error([&] {
    ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", "abc"}}));
  });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'scale' of scaler 'static' must be a finite number, "
                        "got 'abc' (from command line)");
}

// Decimal numbers only: strtod alone took "0x10" as 16 and "5\0" (from Python, where a
// string may hold a NUL) as 5.
BOOST_AUTO_TEST_CASE(hex_and_embedded_nul_are_refused) {
  for (const std::string& text : {std::string("0x10"), std::string("0X1p4"), std::string("5\0", 2)}) {
    const Caught e = catch_error([&] {
      ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", text}}));
    });
    AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
    AMPKIT_CHECK_CONTAINS(e.message, "option 'scale' of scaler 'static' must be a finite decimal number");
  }
  const auto r = ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", "0.5e3"}}));
  BOOST_TEST(setting(r, "scale").value == "500");  // a plain decimal with an exponent still parses
}

BOOST_AUTO_TEST_CASE(non_finite_float_is_refused) {
  for (const char* text : {"inf", "nan", "1e999"}) {
    BOOST_TEST_CONTEXT("scale=" << text) {
      const Caught e = catch_error([&] {
        ampkit::resolve_options(descriptor("scaler", "static"), inputs({{"scale", text}}));
      });
      AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
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
      AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
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
  const Caught e = catch_error([&] { ampkit::resolve_options(d, inputs({}, {{"norm_type", "3"}})); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'norm_type' of clipper 'norm' must be one of 2|inf, got '3' "
                        "(from config file run.yaml)");
  const auto r = ampkit::resolve_options(d, inputs({{"norm_type", "inf"}}));
  BOOST_TEST(r.values.get_string("norm_type") == "inf");
}

BOOST_AUTO_TEST_CASE(misspelt_environment_variable_is_an_error) {
  const ScopedEnv env("AMPKIT_SCALER_SCLAE", "2");
  const Caught e =
      catch_error([&] { ampkit::resolve_options(descriptor("scaler", "static"), inputs({}, {}, true)); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
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
  const Caught e =
      catch_error([&] { ampkit::resolve_options(descriptor("clipper", "norm"), inputs({}, {}, true)); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message,
                        "option 'max_norm' of clipper 'norm' must be float > 0, got '-1' "
                        "(from environment AMPKIT_CLIPPER_MAX_NORM)");
}

BOOST_AUTO_TEST_CASE(environment_names_are_upper_case_kind_and_option) {
  BOOST_TEST(ampkit::option_environment_name("nan_policy", "max_consecutive") ==
             "AMPKIT_NAN_POLICY_MAX_CONSECUTIVE");
  BOOST_TEST(ampkit::option_environment_name("scaler", "scale") == "AMPKIT_SCALER_SCALE");
}

BOOST_AUTO_TEST_CASE(per_precision_default_follows_the_run_precision) {
  using ampkit::Precision;
  const auto& d = descriptor("clipper", "norm");
  const std::vector<std::tuple<Precision, std::string, double>> cases = {
      {Precision::fp16, "1", 1.0}, {Precision::bf16, "5", 5.0}, {Precision::fp32, "10", 10.0}};
  for (const auto& [precision, text, value] : cases) {
    BOOST_TEST_CONTEXT(ampkit::to_string(precision)) {
      const auto r = ampkit::resolve_options(d, inputs({}, {}, false, precision));
      const auto& s = setting(r, "max_norm");
      BOOST_TEST(s.set);
      BOOST_TEST(s.value == text);
      BOOST_TEST(s.source == std::string("default for ") + ampkit::to_string(precision));
      BOOST_TEST(s.default_value == "fp16=1;bf16=5;fp32=10");
      BOOST_TEST_REQUIRE(s.precision_defaults.size() == 3u);
      BOOST_TEST(s.precision_defaults[0].first == "fp16");
      BOOST_TEST(s.precision_defaults[0].second == "1");
      BOOST_TEST(r.values.get_float("max_norm") == value);
      // A plain default is still just "default".
      BOOST_TEST(setting(r, "norm_type").source == "default");
      // The clipper built from these values clips at the precision's threshold.
      auto clipper = plugin("clipper", "norm").create(r.values);
      ampkit::StepStats stats;
      stats.grad_norm = 1000.0;
      const auto clip = static_cast<ampkit::GradClipper*>(clipper.get())->clip(stats);
      BOOST_TEST(clip.threshold == value);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_explicit_value_beats_the_per_precision_default) {
  const auto& d = descriptor("clipper", "norm");
  auto r = ampkit::resolve_options(
      d, inputs({{"max_norm", "2.5"}}, {{"max_norm", "7"}}, false, ampkit::Precision::fp16));
  BOOST_TEST(setting(r, "max_norm").value == "2.5");
  BOOST_TEST(setting(r, "max_norm").source == "command line");
  r = ampkit::resolve_options(d, inputs({}, {{"max_norm", "7"}}, false, ampkit::Precision::bf16));
  BOOST_TEST(setting(r, "max_norm").value == "7");
  BOOST_TEST(setting(r, "max_norm").source == "config file run.yaml");
  const ScopedEnv env("AMPKIT_CLIPPER_MAX_NORM", "3");
  r = ampkit::resolve_options(d, inputs({}, {{"max_norm", "7"}}, true, ampkit::Precision::fp32));
  BOOST_TEST(setting(r, "max_norm").value == "3");
  BOOST_TEST(setting(r, "max_norm").source == "environment AMPKIT_CLIPPER_MAX_NORM");
  BOOST_TEST(r.values.get_float("max_norm") == 3.0);
}

BOOST_AUTO_TEST_CASE(a_precision_the_default_does_not_list_stays_unset) {
  const PerPrecisionPlugin p("fp16=0.5;bf16=2.0");
  auto r = ampkit::resolve_options(p.descriptor, inputs({}, {}, false, ampkit::Precision::fp32));
  BOOST_TEST(!setting(r, "limit").set);
  BOOST_TEST(setting(r, "limit").source == "unset");
  BOOST_TEST(setting(r, "limit").default_value == "fp16=0.5;bf16=2");  // canonical form
  r = ampkit::resolve_options(p.descriptor, inputs({}, {}, false, ampkit::Precision::bf16));
  BOOST_TEST(setting(r, "limit").value == "2");
  BOOST_TEST(setting(r, "limit").source == "default for bf16");
}

BOOST_AUTO_TEST_CASE(every_per_precision_default_is_validated_whatever_the_run_precision) {
  // bf16's default breaks the range; a fp32 run (and an explicit value) must not hide it.
  const PerPrecisionPlugin bad_value("fp16=1;bf16=-5;fp32=10");
  for (const auto& in : {inputs({}, {}, false, ampkit::Precision::fp32), inputs({{"limit", "3"}})}) {
    const Caught e = catch_error([&] { ampkit::resolve_options(bad_value.descriptor, in); });
    AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
    AMPKIT_CHECK_CONTAINS(
        e.message, "option 'limit' of clipper 'fake' must be float > 0, got '-5' (from default for bf16)");
  }
  const PerPrecisionPlugin not_a_number("fp16=1;bf16=abc");
  Caught e = catch_error([&] { ampkit::resolve_options(not_a_number.descriptor, inputs({})); });
  AMPKIT_REQUIRE_ERROR(e, ErrorCategory::usage);
  AMPKIT_CHECK_CONTAINS(e.message, "must be a finite number, got 'abc' (from default for bf16)");
  // A malformed list is the plugin's fault: a plugin error naming the option and the text.
  for (const auto& [text, why] :
       std::vector<std::pair<const char*, std::string>>{{"fp16=1;fp8=2", "names an unknown precision 'fp8'"},
                                                        {"fp16=1;fp16=2", "names fp16 twice"},
                                                        {"fp16=1;5", "has '5' without '='"},
                                                        {"fp16=1;", "has '' without '='"},
                                                        {"", "is empty"}}) {
    BOOST_TEST_CONTEXT(text) {
      const PerPrecisionPlugin p(text);
      e = catch_error(
          [&] { ampkit::resolve_options(p.descriptor, inputs({}, {}, false, ampkit::Precision::fp16)); });
      AMPKIT_REQUIRE_ERROR(e, ErrorCategory::plugin);
      AMPKIT_CHECK_CONTAINS(e.message,
                            "clipper 'fake' declares option 'limit' with a per-precision default '" +
                                std::string(text) + "' that " + why);
    }
  }
}

// ampkit/testing.h resolves options without the host; it must hand a plugin exactly what the
// host would: the same values for every built-in plugin at every precision, and a refusal for a
// value the host refuses.
BOOST_AUTO_TEST_CASE(testing_h_resolves_every_built_in_plugin_as_the_host_does) {
  ampkit::Registry registry(only({kPluginDir}));
  size_t compared = 0;
  for (const auto& info : registry.scan().plugins) {
    const ampkit_plugin_descriptor& d = registry.load(info).descriptor();
    for (const auto precision : {ampkit::Precision::fp32, ampkit::Precision::bf16, ampkit::Precision::fp16}) {
      BOOST_TEST_CONTEXT(info.kind << " '" << info.name << "' " << ampkit::to_string(precision)) {
        OptionInputs inputs;
        inputs.read_environment = false;
        inputs.precision = precision;
        const auto host = resolve_options(d, inputs).values.all();
        const auto testing = ampkit::testing::resolve(d, {}, precision).all();
        BOOST_TEST((host == testing));
        ++compared;
      }
    }
    for (uint32_t i = 0; i < d.option_count; ++i) {
      const ampkit_option_spec& spec = d.options[i];
      if (spec.type == AMPKIT_OPTION_STRING) continue;
      BOOST_TEST_CONTEXT(info.name << "." << spec.name << "=not-a-value") {
        OptionInputs bad;
        bad.read_environment = false;
        bad.command_line[spec.name] = "not-a-value";
        BOOST_CHECK_THROW(resolve_options(d, bad), ampkit::Error);
        BOOST_CHECK_THROW(ampkit::testing::resolve(d, {{spec.name, "not-a-value"}}), std::invalid_argument);
      }
    }
  }
  BOOST_TEST(compared >= 3u * 16u);
}

BOOST_AUTO_TEST_SUITE_END()
