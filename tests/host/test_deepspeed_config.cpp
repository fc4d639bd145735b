// DeepSpeed configs: map_deepspeed_config's numbers (DeepSpeed's meaning and defaults, checked
// against 0.17.0's runtime/constants.py, 0.17.1's precision_config.py and both releases'
// fp16/loss_scaler.py) and ampkit-train's --config.
#define BOOST_TEST_MODULE deepspeed_config
#include <ampkit/deepspeed_config.h>
#include <ampkit/error.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "config/train_config.h"
#include "test_paths.h"

using ampkit::DeepSpeedMapping;
using ampkit::DeepSpeedVersion;
using ampkit::map_deepspeed_config;

namespace {

constexpr auto kV0170 = DeepSpeedVersion::v0_17_0;
constexpr auto kV0171 = DeepSpeedVersion::v0_17_1;

std::string usage_error(const std::string& text, std::optional<DeepSpeedVersion> version = std::nullopt) {
  try {
    map_deepspeed_config(text, "ds.json", version);
  } catch (const ampkit::Error& e) {
    BOOST_TEST(static_cast<int>(e.category()) == static_cast<int>(ampkit::ErrorCategory::usage));
    return e.what();
  }
  BOOST_FAIL("no error for " + text);
  return "";
}

ampkit::TrainConfig parse_with(const std::string& config_text, const std::string& extra = "") {
  const std::string file = "/tmp/ampkit-test-ds-" + std::to_string(::getpid()) + ".json";
  std::ofstream(file) << config_text;
  std::vector<std::string> words = {"ampkit-train", "--workload", "synthetic", "--config", file};
  if (!extra.empty()) words.push_back(extra);
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  ampkit::TrainConfig cfg = ampkit::parse_train_config(static_cast<int>(argv.size()), argv.data());
  ::unlink(file.c_str());
  return cfg;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fp16_section_with_dynamic_keys_gets_deepspeeds_config_defaults) {
  const DeepSpeedMapping m = map_deepspeed_config(
      R"({"fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 500}, "gradient_clipping": 1.5,
          "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}})",
      "ds.json");
  BOOST_TEST(std::string(to_string(m.precision)) == "fp16");
  BOOST_TEST(m.plugins.at("scaler") == "dynamic");
  BOOST_TEST(m.plugins.at("clipper") == "norm");
  BOOST_TEST(m.options.at("scaler").at("init_scale") == "4096");
  BOOST_TEST(m.options.at("scaler").at("growth_interval") == "500");
  BOOST_TEST(m.options.at("scaler").at("hysteresis") == "2");  // constants.py's FP16_HYSTERESIS_DEFAULT
  BOOST_TEST(m.options.at("scaler").at("min_scale") == "1");
  BOOST_TEST(m.options.at("clipper").at("max_norm") == "1.5");
  BOOST_TEST(m.unmapped.empty());  // zero_optimization and optimizer are not ours: no warning
}

BOOST_AUTO_TEST_CASE(fp16_alone_takes_the_defaults_of_the_version_and_static_scale) {
  // 0.17.0: DynamicLossScaler's constructor defaults when the section names no dynamic key.
  const DeepSpeedMapping alone = map_deepspeed_config(R"({"fp16": {"enabled": true}})", "ds.json", kV0170);
  BOOST_TEST(alone.options.at("scaler").at("init_scale") == "4294967296");  // 2**32
  BOOST_TEST(alone.options.at("scaler").at("hysteresis") == "1");
  BOOST_TEST(alone.options.at("scaler").at("growth_interval") == "1000");
  BOOST_TEST(alone.options.at("scaler").at("growth_delay") == "0");
  // 0.17.1 (the default): DeepSpeedFP16Config's field defaults always, and one clean step more.
  const DeepSpeedMapping latest = map_deepspeed_config(R"({"fp16": {"enabled": true}})", "ds.json");
  BOOST_TEST(latest.options.at("scaler") == (std::map<std::string, std::string>{{"init_scale", "65536"},
                                                                                {"growth_interval", "1000"},
                                                                                {"hysteresis", "2"},
                                                                                {"min_scale", "1"},
                                                                                {"growth_delay", "1"}}));
  BOOST_TEST(latest.unmapped.empty());
  const DeepSpeedMapping fixed =
      map_deepspeed_config(R"({"fp16": {"enabled": true, "loss_scale": 128, "hysteresis": 2}})", "ds.json");
  BOOST_TEST(fixed.plugins.at("scaler") == "static");
  BOOST_TEST(fixed.options.at("scaler").at("scale") == "128");
  BOOST_REQUIRE(fixed.unmapped.size() == 1u);
  BOOST_TEST(fixed.unmapped[0] == "fp16.hysteresis (unused with a static loss_scale)");
}

BOOST_AUTO_TEST_CASE(bf16_batch_sizes_and_unmapped_keys) {
  const DeepSpeedMapping m = map_deepspeed_config(
      R"({"bf16": {"enabled": true, "immediate_grad_update": true}, "train_micro_batch_size_per_gpu": 8,
          "gradient_accumulation_steps": 4, "train_batch_size": 64, "amp": {"enabled": true}})",
      "ds.json");
  BOOST_TEST(std::string(to_string(m.precision)) == "bf16");
  BOOST_TEST(m.plugins.at("scaler") == "none");
  BOOST_TEST(*m.micro_batch_size == 8);
  BOOST_TEST(*m.accumulation_steps == 4);
  BOOST_TEST(*m.global_batch_size == 64);
  BOOST_TEST(m.unmapped == (std::vector<std::string>{"bf16.immediate_grad_update", "amp"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_configs_are_one_usage_error_each) {
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})").find("enables both") !=
             std::string::npos);
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": "auto"}})").find("fp16.enabled is \"auto\"") !=
             std::string::npos);
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": "yes"}})").find("fp16.enabled must be true or false") !=
             std::string::npos);
  BOOST_TEST(usage_error(R"({"gradient_clipping": "big"})").find("gradient_clipping must be a number") !=
             std::string::npos);
  BOOST_TEST(usage_error(R"({"train_micro_batch_size_per_gpu": 0.5})").find("whole number in [1, 1e15]") !=
             std::string::npos);
  BOOST_TEST(usage_error("[1, 2]").find("must be a JSON object") != std::string::npos);
}

// Values DeepSpeed's config classes refuse, each named by its DeepSpeed key (found by a review
// against deepspeed/runtime/precision_config.py): they had been truncated (3.5 -> 2**3), wrapped
// (1e20 -> init_scale 0, reported as ampkit's option), taken as dynamic (-1) or ignored (fp16: true).
BOOST_AUTO_TEST_CASE(out_of_range_values_and_sections_are_usage_errors_naming_the_deepspeed_key) {
  const auto fp16 = [](const std::string& entry) { return R"({"fp16": {"enabled": true, )" + entry + "}}"; };
  BOOST_TEST(usage_error(fp16(R"("initial_scale_power": 3.5)"))
                 .find("fp16.initial_scale_power must be a whole number in [-126, 127], got 3.5") !=
             std::string::npos);
  BOOST_TEST(usage_error(fp16(R"("initial_scale_power": 1e20)")).find("fp16.initial_scale_power") !=
             std::string::npos);
  BOOST_TEST(usage_error(fp16(R"("loss_scale": -1)")).find("fp16.loss_scale must be in [0, 3.4e+38]") !=
             std::string::npos);
  BOOST_TEST(usage_error(fp16(R"("loss_scale": 1e40)")).find("fp16.loss_scale must be in [0, 3.4e+38]") !=
             std::string::npos);
  BOOST_TEST(
      usage_error(fp16(R"("loss_scale_window": 2.5)")).find("fp16.loss_scale_window must be a whole") !=
      std::string::npos);
  BOOST_TEST(
      usage_error(fp16(R"("hysteresis": 0)")).find("fp16.hysteresis must be a whole number in [1, 1e15]") !=
      std::string::npos);
  BOOST_TEST(usage_error(fp16(R"("min_loss_scale": 0)"), kV0170).find("fp16.min_loss_scale must be > 0") !=
             std::string::npos);
  // 0.17.1's min_loss_scale is an int field: a fraction is refused, as pydantic refuses it.
  BOOST_TEST(usage_error(fp16(R"("min_loss_scale": 0.125)"))
                 .find("fp16.min_loss_scale must be a whole number in [1, 1e15], got 0.125") !=
             std::string::npos);
  BOOST_TEST(usage_error(R"({"fp16": true})").find("fp16 must be an object, got true") != std::string::npos);
  BOOST_TEST(usage_error(R"({"bf16": "yes"})").find("bf16 must be an object") != std::string::npos);
  const DeepSpeedMapping low =
      map_deepspeed_config(fp16(R"("initial_scale_power": -3, "min_loss_scale": 0.125)"), "ds.json", kV0170);
  BOOST_TEST(low.options.at("scaler").at("init_scale") == "0.125");
  // DeepSpeed takes a start below min_loss_scale (and rises to it at the first overflow): ampkit
  // starts at the minimum, and says so.
  const DeepSpeedMapping below = map_deepspeed_config(fp16(R"("min_loss_scale": 131072)"), "ds.json");
  BOOST_TEST(below.options.at("scaler").at("init_scale") == "131072");
  BOOST_REQUIRE(below.unmapped.size() == 1u);
  BOOST_TEST(below.unmapped[0].find("2**power = 65536 is below min_loss_scale 131072") != std::string::npos);
}

// An HF-style config leaves batch sizes "auto" for the launcher: they are not ours to resolve.
BOOST_AUTO_TEST_CASE(batch_sizes_left_auto_are_left_to_the_launcher) {
  const DeepSpeedMapping m = map_deepspeed_config(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "bf16": {"enabled": true}})",
      "ds.json");
  BOOST_TEST(std::string(to_string(m.precision)) == "bf16");
  BOOST_TEST(!m.micro_batch_size.has_value());
  BOOST_TEST(!m.accumulation_steps.has_value());
  BOOST_TEST(!m.global_batch_size.has_value());
  BOOST_TEST(m.unmapped.empty());
  BOOST_TEST(usage_error(R"({"gradient_clipping": "auto"})").find("gradient_clipping is \"auto\"") !=
             std::string::npos);
  BOOST_TEST(
      parse_with(R"({"train_micro_batch_size_per_gpu": "auto", "fp16": {"enabled": true}})", "--batch-size=6")
          .batch_size == 6);
}

BOOST_AUTO_TEST_CASE(ampkit_train_config_reads_a_deepspeed_file_below_the_command_line) {
  const std::string ds = R"({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
      "gradient_clipping": 0.5, "fp16": {"enabled": true, "initial_scale_power": 10, "auto_cast": false}})";
  ampkit::TrainConfig cfg = parse_with(ds);
  BOOST_TEST(std::string(to_string(cfg.precision)) == "fp16");
  BOOST_TEST(cfg.batch_size == 16);
  BOOST_TEST(cfg.accumulate == 2);
  BOOST_TEST(cfg.plugins.at("scaler") == "dynamic");
  BOOST_TEST(cfg.plugins.at("clipper") == "norm");
  BOOST_TEST(cfg.plugin_options_file.at("scaler").at("init_scale") == "1024");
  BOOST_TEST(cfg.plugin_options_file.at("clipper").at("max_norm") == "0.5");
  BOOST_REQUIRE(cfg.config_warnings.size() == 1u);
  BOOST_TEST(cfg.config_warnings[0].find("ignored: fp16.auto_cast") != std::string::npos);
  // The command line wins over the file, as for any --config.
  BOOST_TEST(parse_with(ds, "--batch-size=4").batch_size == 4);
  // A global batch size alone cannot be split per rank: named in the warning.
  const ampkit::TrainConfig global = parse_with(R"({"train_batch_size": 64, "bf16": {"enabled": true}})");
  BOOST_TEST(std::string(to_string(global.precision)) == "bf16");
  BOOST_REQUIRE(global.config_warnings.size() == 1u);
  BOOST_TEST(global.config_warnings[0].find("train_batch_size (--batch-size is per rank") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_key_given_twice_is_refused_naming_it_in_both_hosts_readers) {
  // nlohmann would keep the last value (scale 128, a static scaler) in silence; DeepSpeed refuses.
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": true, "loss_scale": 0, "loss_scale": 128}})") ==
             "DeepSpeed config ds.json gives key 'fp16.loss_scale' twice: give each key once (DeepSpeed "
             "refuses it too)");
  BOOST_TEST(
      usage_error(R"({"gradient_clipping": 1.0, "bf16": {"enabled": true}, "gradient_clipping": 0})") ==
      "DeepSpeed config ds.json gives key 'gradient_clipping' twice: give each key once (DeepSpeed "
      "refuses it too)");
  // The same key in two objects, or in objects of an array, is no duplicate.
  const DeepSpeedMapping m = map_deepspeed_config(
      R"({"fp16": {"enabled": true, "loss_scale": 64}, "bf16": {"enabled": false},
          "optimizer": {"params": [{"lr": 1}, {"lr": 2}]}})",
      "ds.json");
  BOOST_TEST(m.plugins.at("scaler") == "static");
  // ampkit-train's --config reads a DeepSpeed file through the same reader.
  BOOST_CHECK_EXCEPTION(parse_with(R"({"fp16": {"enabled": true, "hysteresis": 2, "hysteresis": 4}})"),
                        ampkit::Error, [](const ampkit::Error& e) {
                          return std::string(e.what()).find("gives key 'fp16.hysteresis' twice") !=
                                 std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(the_version_words_and_the_configs_own_key) {
  BOOST_TEST((ampkit::parse_deepspeed_version("0.17.0") == kV0170));
  BOOST_TEST((ampkit::parse_deepspeed_version("0.17.1") == kV0171));
  BOOST_TEST((ampkit::parse_deepspeed_version("latest") == kV0171));
  BOOST_CHECK_EXCEPTION(ampkit::parse_deepspeed_version("0.16.9"), ampkit::Error, [](const ampkit::Error& e) {
    return std::string(e.what()) ==
           "DeepSpeed version '0.16.9' is not one ampkit maps: give 0.17.0, 0.17.1 or latest";
  });
  // The config may name its release itself (DeepSpeed ignores the key); it is no unmapped key.
  const std::string pinned = R"({"ampkit_deepspeed_version": "0.17.0", "fp16": {"enabled": true}})";
  const DeepSpeedMapping m = map_deepspeed_config(pinned, "ds.json");
  BOOST_TEST((m.version == kV0170));
  BOOST_TEST(m.options.at("scaler").at("growth_delay") == "0");
  BOOST_TEST(m.options.at("scaler").at("init_scale") == "4294967296");
  BOOST_TEST(m.unmapped.empty());
  BOOST_TEST((map_deepspeed_config(pinned, "ds.json", kV0170).version == kV0170));
  BOOST_TEST(usage_error(pinned, kV0171) ==
             "DeepSpeed config ds.json names ampkit_deepspeed_version 0.17.0, but DeepSpeed 0.17.1's rules "
             "were asked for: give one");
  BOOST_TEST(usage_error(R"({"ampkit_deepspeed_version": "0.18"})") ==
             "DeepSpeed version '0.18' is not one ampkit maps: give 0.17.0, 0.17.1 or latest");
  BOOST_TEST(usage_error(R"({"ampkit_deepspeed_version": 0.17})")
                 .find("ampkit_deepspeed_version must be a text such as \"0.17.1\", got 0.17") !=
             std::string::npos);
}

// 0.17.1's config models forbid keys they do not declare (pydantic extra="forbid"), in a section
// that is not enabled too; 0.17.0 read the keys it knew and ignored the others.
BOOST_AUTO_TEST_CASE(keys_deepspeed_0_17_1_refuses_are_usage_errors_and_0_17_0_reads_them) {
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": true, "raise_error_at_min_scale": false}})") ==
             "DeepSpeed config ds.json: fp16.raise_error_at_min_scale is no key of DeepSpeed 0.17.1's fp16 "
             "section, which refuses it (it takes auto_cast, consecutive_hysteresis, enabled, "
             "fp16_master_weights_and_grads, hysteresis, initial_scale_power, loss_scale, loss_scale_window, "
             "min_loss_scale); set the scaler's on_min_scale instead, or map by DeepSpeed 0.17.0's rules");
  BOOST_TEST(usage_error(R"({"fp16": {"enabled": false, "loss_scal": 0}})")
                 .find("fp16.loss_scal is no key of DeepSpeed 0.17.1's fp16 section") != std::string::npos);
  BOOST_TEST(
      usage_error(R"({"bfloat16": {"enabled": true, "loss_scale": 1}})")
          .find("bfloat16.loss_scale is no key of DeepSpeed 0.17.1's bfloat16 section, which refuses it "
                "(it takes check_grad_overflow, enabled, immediate_grad_update)") != std::string::npos);
  const DeepSpeedMapping old = map_deepspeed_config(
      R"({"fp16": {"enabled": true, "raise_error_at_min_scale": false, "loss_scal": 0}})", "ds.json", kV0170);
  BOOST_TEST(old.options.at("scaler").at("on_min_scale") == "clamp");
  BOOST_TEST(old.unmapped == std::vector<std::string>{"fp16.loss_scal"}, boost::test_tools::per_element());
}

// The scaler configs of tests/data/deepspeed_scaler_goldens.json (DeepSpeed's own update_scale),
// written as DeepSpeed config keys, map onto the options tests/python/test_deepspeed_goldens.py
// steps the dynamic scaler with: the same constructor arguments DeepSpeed's config gives.
BOOST_AUTO_TEST_CASE(the_goldens_scaler_configs_map_onto_the_same_scaler_per_version) {
  std::ifstream in(std::string(ampkit::test::source_dir()) + "/tests/data/deepspeed_scaler_goldens.json");
  const nlohmann::json goldens = nlohmann::json::parse(in);
  std::set<std::string> seen;
  for (const auto& c : goldens.at("cases")) {
    const nlohmann::json& k = c.at("scaler");
    if (!seen.insert(k.dump()).second) continue;
    const double init = k.at("init_scale").get<double>();
    nlohmann::json fp16 = {{"enabled", true},
                           {"initial_scale_power", static_cast<int>(std::log2(init))},
                           {"loss_scale_window", k.at("scale_window")},
                           {"hysteresis", k.at("delayed_shift")},
                           {"min_loss_scale", k.at("min_scale")},
                           {"consecutive_hysteresis", false}};
    for (const auto version : {kV0170, kV0171}) {
      nlohmann::json section = fp16;
      if (version == kV0170) section["raise_error_at_min_scale"] = k.at("raise_error_at_min_scale");
      const DeepSpeedMapping m =
          map_deepspeed_config(nlohmann::json{{"fp16", section}}.dump(), "ds.json", version);
      const auto& o = m.options.at("scaler");
      BOOST_TEST(m.plugins.at("scaler") == "dynamic");
      BOOST_TEST(std::stod(o.at("init_scale")) == std::max(init, k.at("min_scale").get<double>()));
      BOOST_TEST(o.at("growth_interval") == k.at("scale_window").dump());
      BOOST_TEST(o.at("hysteresis") == k.at("delayed_shift").dump());
      BOOST_TEST(o.at("min_scale") == k.at("min_scale").dump());
      BOOST_TEST(o.at("growth_delay") == (version == kV0170 ? "0" : "1"));
    }
  }
  BOOST_TEST(seen.size() == 8u);
}

BOOST_AUTO_TEST_CASE(ampkit_train_maps_by_the_latest_rules_or_the_ones_the_file_names) {
  const std::string ds = R"({"fp16": {"enabled": true, "loss_scale_window": 4}})";
  BOOST_TEST(parse_with(ds).plugin_options_file.at("scaler").at("growth_delay") == "1");
  const ampkit::TrainConfig old = parse_with(
      R"({"ampkit_deepspeed_version": "0.17.0", "fp16": {"enabled": true, "loss_scale_window": 4}})");
  BOOST_TEST(old.plugin_options_file.at("scaler").at("growth_delay") == "0");
  BOOST_TEST(old.config_warnings.empty());
}
