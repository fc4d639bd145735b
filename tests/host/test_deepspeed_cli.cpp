// ampkit-train --config with a DeepSpeed config: the release's rules as a user sees them (the
// scale of each step in --metrics, --print-config's growth_delay and its source, the exit codes).
#define BOOST_TEST_MODULE deepspeed_cli
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "train_process.h"

using ampkit::test::Result;
using ampkit::test::run;
using ampkit::test::TempDir;
using ampkit::test::tiny;

namespace {

std::string write_config(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << text;
  return path;
}

// The scale each step ran with, from --metrics.
std::vector<double> scales_of_run(const TempDir& dir, const std::string& config, int steps) {
  const std::string metrics = (dir.path / "metrics.jsonl").string();
  const Result r =
      run(tiny + " --config " + config + " --steps " + std::to_string(steps) + " --metrics " + metrics);
  BOOST_TEST_REQUIRE(r.code == 0, r.output);
  std::vector<double> scales;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) scales.push_back(nlohmann::json::parse(line).at("scale"));
  return scales;
}

}  // namespace

// Clean steps from 2**4 with loss_scale_window 3: DeepSpeed 0.17.0 grows after 3, 0.17.1 after 4
// (tests/data/deepspeed_scaler_goldens.json, window3_hysteresis1/clean, has the same shape).
BOOST_AUTO_TEST_CASE(the_scale_grows_one_clean_step_later_by_0_17_1s_rules) {
  TempDir dir;
  const std::string fp16 = R"("fp16": {"enabled": true, "initial_scale_power": 4, "loss_scale_window": 3})";
  const std::string latest = write_config(dir, "latest.json", "{" + fp16 + "}");
  const std::string old =
      write_config(dir, "old.json", R"({"ampkit_deepspeed_version": "0.17.0", )" + fp16 + "}");
  BOOST_TEST(scales_of_run(dir, latest, 8) == (std::vector<double>{16, 16, 16, 16, 32, 32, 32, 64}),
             boost::test_tools::per_element());
  BOOST_TEST(scales_of_run(dir, old, 8) == (std::vector<double>{16, 16, 16, 32, 32, 32, 64, 64}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(print_config_shows_growth_delay_from_the_config_file) {
  TempDir dir;
  for (const auto& [version, delay] : {std::pair<std::string, std::string>{"", "1"}, {"0.17.0", "0"}}) {
    const std::string key = version.empty() ? "" : R"("ampkit_deepspeed_version": ")" + version + R"(", )";
    const std::string config = write_config(dir, "ds.json", "{" + key + R"("fp16": {"enabled": true}})");
    const Result r = run(tiny + " --config " + config + " --print-config");
    BOOST_TEST_REQUIRE(r.code == 0, r.output);
    const std::regex line("\n +growth_delay +int[^\n]*? " + delay + " +config file " + config + " ");
    BOOST_TEST(std::regex_search(r.output, line), r.output);
  }
}

BOOST_AUTO_TEST_CASE(a_release_ampkit_does_not_map_and_a_key_0_17_1_refuses_are_usage_errors) {
  TempDir dir;
  const Result unknown =
      run(tiny + " --config " +
          write_config(dir, "v.json", R"({"ampkit_deepspeed_version": "0.16", "bf16": {}})"));
  BOOST_TEST(unknown.code == 2);
  BOOST_TEST(unknown.output ==
             "ampkit-train: error: DeepSpeed version '0.16' is not one ampkit maps: give 0.17.0, 0.17.1 or "
             "latest\n");
  const std::string raise = R"("fp16": {"enabled": true, "raise_error_at_min_scale": false}})";
  const Result refused = run(tiny + " --config " + write_config(dir, "r.json", "{" + raise));
  BOOST_TEST(refused.code == 2);
  BOOST_TEST(
      refused.output.find("fp16.raise_error_at_min_scale is no key of DeepSpeed 0.17.1's fp16 section") !=
      std::string::npos);
  const std::string pinned = R"({"ampkit_deepspeed_version": "0.17.0", )" + raise;
  BOOST_TEST(run(tiny + " --config " + write_config(dir, "p.json", pinned) + " --steps 1").code == 0);
}
