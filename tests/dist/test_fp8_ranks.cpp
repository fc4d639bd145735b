// ampkit-train --fp8 on two Gloo ranks: the amaxes are reduced with MAX before each scale update,
// so both ranks cast with the same scales at every step (--check-ranks compares them bit for bit).
#define BOOST_TEST_MODULE fp8_ranks
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "free_port.h"
#include "train_process.h"

using namespace ampkit::test;

BOOST_AUTO_TEST_CASE(two_gloo_ranks_cast_with_identical_scales) {
  TempDir tmp;
  const std::string launch = std::string(bin_dir()) + "/ampkit-launch";
  const std::filesystem::path metrics = tmp.path / "m.jsonl", summary = tmp.path / "s.json";
  // Each rank sees its own half of every batch, so its own amaxes differ from the other's: without
  // the reduction the ranks' input scales part at step 1 and --check-ranks stops the job (exit 7).
  const Result r = run(
      launch + " --nproc-per-node 2 --master-port " + std::to_string(free_port()) + " -- " + train +
      " --workload char-gpt --precision bf16 --gpt-layers 1 --gpt-width 64 --gpt-context 32 --batch-size 8 "
      "--threads 1 --progress never --steps 30 --fp8 delayed --check-ranks --metrics " +
      metrics.string() + " --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  BOOST_TEST(read_json(summary)["world_size"].get<int>() == 2);
  BOOST_TEST(read_json(summary)["ranks_identical"].get<bool>());
  std::vector<nlohmann::json> rows;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  BOOST_REQUIRE_EQUAL(rows.size(), 30u);
  // The scales moved off their initial 1: the compared values are real scales.
  BOOST_TEST(rows.back()["fp8"]["input"]["scale_min"].get<double>() > 10.0);
  BOOST_TEST(rows.back()["fp8"]["grad_output"]["scale_min"].get<double>() > 10.0);
}
