// ampkit-train --fp8 RECIPE: char-gpt learns as in bf16, a stop-and-resume is exact, the recipe's
// options and errors are those of every plugin kind, and a scripted model is refused. The char-gpt
// case is slow (test_fp8_train_slow).
#define BOOST_TEST_MODULE fp8_train
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train_process.h"

namespace fs = std::filesystem;

namespace {

using ampkit::test::read_json;
using ampkit::test::Result;
using ampkit::test::run;
using ampkit::test::TempDir;
using ampkit::test::train;

// The smallest char-gpt that still learns in 400 steps (test loss 2.66 from 5.5): one block of
// width 64 over 32-byte windows, batches of 16, one thread.
const std::string gpt =
    train +
    " --workload char-gpt --precision bf16 --gpt-layers 1 --gpt-width 64 --gpt-context 32 "
    "--batch-size 16 --threads 1 --progress never";

std::vector<nlohmann::json> records(const fs::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

nlohmann::json run_gpt(const TempDir& tmp, const std::string& tag, const std::string& args) {
  const fs::path summary = tmp.path / (tag + ".json");
  const Result r = run(gpt + " " + args + " --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  return read_json(summary);
}

}  // namespace

// About 110 s on two shared cores (five runs of 200-400 steps): labelled slow, run by the ctest
// test test_fp8_train_slow.
BOOST_AUTO_TEST_CASE(char_gpt_in_fp8_reaches_bf16s_test_loss_and_resumes_exactly,
                     *boost::unit_test::label("slow") * boost::unit_test::disabled()) {
  TempDir tmp;
  const double bf16 = run_gpt(tmp, "bf16", "--steps 400")["test_loss"].get<double>();
  const fs::path metrics = tmp.path / "delayed.jsonl";
  const nlohmann::json delayed =
      run_gpt(tmp, "delayed", "--steps 400 --fp8 delayed --metrics " + metrics.string());
  const double current = run_gpt(tmp, "current", "--steps 400 --fp8 current")["test_loss"].get<double>();
  const double loss = delayed["test_loss"].get<double>();
  BOOST_TEST_MESSAGE("test loss: bf16 " << bf16 << ", fp8 delayed " << loss << ", fp8 current " << current);
  BOOST_TEST(bf16 < 3.0);  // it learned: 5.5 (uniform over bytes) at the start
  BOOST_TEST(std::abs(loss - bf16) / bf16 < 0.03);
  BOOST_TEST(std::abs(current - bf16) / bf16 < 0.03);

  // Per step and role: the scale cast with, the amax seen, the saturated fraction; delayed's
  // scales follow the amaxes (1 at the first step, 448 / amax of the window after).
  const auto rows = records(metrics);
  BOOST_REQUIRE_EQUAL(rows.size(), 400u);
  BOOST_TEST(rows[0]["fp8"]["input"]["scale_min"].get<double>() == 1.0);
  const nlohmann::json& last = rows.back()["fp8"];
  for (const char* role : {"input", "weight", "grad_output"}) {
    BOOST_TEST(last[role]["scale_min"].get<double>() > 1.0, role);
    BOOST_TEST(last[role]["amax_max"].get<double>() > 0.0, role);
    BOOST_TEST(last[role]["saturated"].get<double>() < 0.01, role);
  }
  BOOST_TEST(last["nonfinite_amaxes"].get<int>() == 0);

  // Stopped at 200 and resumed: the uninterrupted run's parameters, losses and fp8 figures.
  const std::string ckpt = " --fp8 delayed --checkpoint-dir " + (tmp.path / "ckpt").string();
  run_gpt(tmp, "first", "--steps 200" + ckpt);
  const fs::path resumed = tmp.path / "resumed.jsonl";
  const nlohmann::json second =
      run_gpt(tmp, "second", "--steps 400 --resume auto --metrics " + resumed.string() + ckpt);
  BOOST_TEST(second["param_sha256"].get<std::string>() == delayed["param_sha256"].get<std::string>());
  const auto tail = records(resumed);
  BOOST_REQUIRE_EQUAL(tail.size(), 200u);
  for (size_t i = 0; i < tail.size(); ++i) {
    BOOST_TEST(tail[i]["loss"] == rows[200 + i]["loss"], "step " << 200 + i);
    BOOST_TEST(tail[i]["fp8"] == rows[200 + i]["fp8"], "step " << 200 + i);
  }

  // The checkpoint holds fp8 state: resuming it without --fp8 is an error naming the recipe.
  const Result without =
      run(gpt + " --steps 401 --resume auto --checkpoint-dir " + (tmp.path / "ckpt").string());
  BOOST_TEST(without.code == 6, without.output);  // checkpoint
  BOOST_TEST(without.output.find("holds the state of fp8 recipe 'delayed'; resume it with --fp8 delayed") !=
                 std::string::npos,
             without.output);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_without_fp8_state_resumes_with_a_warning) {
  TempDir tmp;
  const std::string dir = " --checkpoint-dir " + (tmp.path / "ckpt").string();
  run_gpt(tmp, "plain", "--steps 3" + dir);
  const nlohmann::json s = run_gpt(tmp, "fp8", "--steps 5 --resume auto --fp8 current" + dir);
  BOOST_REQUIRE_EQUAL(s["warnings"].size(), 1u);
  BOOST_TEST(s["warnings"][0].get<std::string>().find("holds no fp8 state: fp8 recipe 'current' starts its "
                                                      "scales afresh") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(fp8_options_print_config_and_errors) {
  const Result printed = run(gpt + " --steps 1 --fp8 delayed --opt fp8_recipe.margin=2 --print-config");
  BOOST_REQUIRE_MESSAGE(printed.code == 0, printed.output);
  BOOST_TEST(printed.output.find("fp8_recipe 'delayed'") != std::string::npos, printed.output);
  BOOST_TEST(printed.output.find("2       command line") != std::string::npos, printed.output);
  const Result env =
      run("AMPKIT_FP8_RECIPE_AMAX_HISTORY_LEN=16 " + gpt + " --steps 1 --fp8 delayed --print-config");
  BOOST_TEST(env.output.find("environment AMPKIT_FP8_RECIPE_AMAX_HISTORY_LEN") != std::string::npos,
             env.output);

  const Result help = run(train + " --help --fp8 delayed");
  BOOST_TEST(help.output.find("fp8_recipe 'delayed' options (--opt fp8_recipe.NAME=VALUE, env "
                              "AMPKIT_FP8_RECIPE_NAME):") != std::string::npos,
             help.output);

  const Result unknown = run(gpt + " --steps 1 --fp8 nosuch");
  BOOST_TEST(unknown.code == 3, unknown.output);
  BOOST_TEST(unknown.output.find("unknown fp8_recipe 'nosuch' (available: current, delayed, predictive") !=
                 std::string::npos,
             unknown.output);
  const Result bad = run(gpt + " --steps 1 --fp8 delayed --opt fp8_recipe.margin=99");
  BOOST_TEST(bad.code == 2, bad.output);
  BOOST_TEST(bad.output.find("margin") != std::string::npos, bad.output);

  // A scripted model's linear layers are its own: --fp8 cannot reach them (exit 2, usage).
  TempDir tmp;
  const std::string model = (tmp.path / "m.pt").string(), data = (tmp.path / "d.pt").string();
  const Result made =
      run("python3 -c \"import torch; torch.jit.script(torch.nn.Linear(4, 2)).save('" + model +
          "'); torch.save({'inputs': torch.randn(64, 4), 'targets': torch.randint(0, 2, (64,))}, '" + data +
          "')\"");
  BOOST_REQUIRE_MESSAGE(made.code == 0, made.output);
  const Result scripted = run(train + " --workload torchscript --model " + model + " --data " + data +
                              " --steps 1 --fp8 current");
  BOOST_TEST(scripted.code == 2, scripted.output);
  BOOST_TEST(scripted.output.find("workload torchscript has no layers ampkit-train can run in fp8") !=
                 std::string::npos,
             scripted.output);
}

BOOST_AUTO_TEST_CASE(synthetic_mlp_in_fp8_reaches_bf16s_test_loss) {
  TempDir tmp;
  const std::string mlp =
      train +
      " --workload synthetic --synthetic-width 64 --synthetic-depth 2 --batch-size 32 --threads 1 "
      "--progress never --steps 200 --precision bf16 --summary ";
  const Result a = run(mlp + (tmp.path / "bf16.json").string());
  const Result b = run(mlp + (tmp.path / "fp8.json").string() + " --fp8 delayed --tensorboard " +
                       (tmp.path / "tb").string());
  BOOST_REQUIRE_MESSAGE(a.code == 0 && b.code == 0, a.output + b.output);
  const double bf16 = read_json(tmp.path / "bf16.json")["test_loss"].get<double>();
  const double fp8 = read_json(tmp.path / "fp8.json")["test_loss"].get<double>();
  BOOST_TEST_MESSAGE("synthetic test loss: bf16 " << bf16 << ", fp8 delayed " << fp8);
  BOOST_TEST(std::abs(fp8 - bf16) / bf16 < 0.03);
  // TensorBoard holds the fp8 figures per role beside the step's scalars.
  std::string events;
  for (const auto& f : fs::directory_iterator(tmp.path / "tb")) {
    std::ifstream in(f.path(), std::ios::binary);
    events.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const char* tag : {"fp8/input/scale_min", "fp8/weight/amax_max", "fp8/grad_output/saturated"})
    BOOST_TEST(events.find(tag) != std::string::npos, tag);
}

// --fp8-trace: per step and per cast tensor (layer, role) one record, its amax the metrics' per role
// (the maximum over layers), its summary consistent with it; a path it cannot write is a usage error.
BOOST_AUTO_TEST_CASE(fp8_trace_records_every_cast_tensor_per_step) {
  const char* const kRoles[] = {"input", "weight", "grad_output"};
  TempDir tmp;
  const fs::path trace = tmp.path / "trace.jsonl", metrics = tmp.path / "m.jsonl";
  run_gpt(tmp, "trace",
          "--steps 3 --fp8 current --fp8-trace " + trace.string() + " --metrics " + metrics.string());
  const auto rows = records(trace), steps = records(metrics);
  BOOST_REQUIRE_EQUAL(steps.size(), 3u);
  BOOST_REQUIRE_EQUAL(rows.size(), 3u * 5 * 3);  // 3 steps x 5 layers (4 in the block, the head) x 3 roles
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& r = rows[i];
    BOOST_TEST(r["step"].get<size_t>() == i / 15);
    BOOST_TEST(r["layer"].get<size_t>() == i % 15 / 3);
    const std::string role = r["role"].get<std::string>();
    BOOST_TEST(role == kRoles[i % 3]);
    const double amax = r["amax"].get<double>();
    const auto top = r["top"].get<std::vector<double>>();
    const auto hist = r["hist"].get<std::vector<int64_t>>();
    BOOST_REQUIRE_EQUAL(top.size(), 64u);
    BOOST_TEST(top[0] == amax);  // the largest magnitude, exactly
    BOOST_TEST(top[63] <= top[0]);
    BOOST_REQUIRE(!hist.empty());
    BOOST_TEST(hist.front() > 0);
    BOOST_TEST(hist.back() > 0);
    // The last bin holds the amax: floor((log2(amax) + 80) * 32).
    BOOST_TEST(r["hist_first"].get<int64_t>() + static_cast<int64_t>(hist.size()) - 1 ==
               static_cast<int64_t>(std::floor((std::log2(amax) + 80) * 32)));
    int64_t counted = 0;
    for (int64_t c : hist) counted += c;
    BOOST_TEST(counted <= r["count"].get<int64_t>());  // zeros are not binned
    BOOST_TEST(counted > r["count"].get<int64_t>() / 2);
    if (role == "weight") BOOST_TEST(counted == r["count"].get<int64_t>());
  }
  // Layer 0 (qkv) casts its input, 16 x 32 rows of width 64; the head's weight is 256 x 64.
  BOOST_TEST(rows[0]["count"].get<int64_t>() == 16 * 32 * 64);
  BOOST_TEST(rows[13]["count"].get<int64_t>() == 256 * 64);
  for (size_t s = 0; s < 3; ++s)
    for (size_t role = 0; role < 3; ++role) {
      double amax = 0;
      for (size_t layer = 0; layer < 5; ++layer)
        amax = std::max(amax, rows[s * 15 + layer * 3 + role]["amax"].get<double>());
      const std::string name = rows[role]["role"].get<std::string>();
      BOOST_TEST(amax == steps[s]["fp8"][name]["amax_max"].get<double>(), "step " << s << " " << name);
    }

  const std::string bad_path = (tmp.path / "no-such-folder" / "trace.jsonl").string();
  const Result bad = run(gpt + " --steps 1 --fp8 current --fp8-trace " + bad_path);
  BOOST_TEST(bad.code == 2, bad.output);
  BOOST_TEST(bad.output.find("cannot write the fp8 trace file " + bad_path) != std::string::npos, bad.output);
  const Result no_fp8 = run(gpt + " --steps 1 --fp8-trace " + trace.string());
  BOOST_TEST(no_fp8.code == 2, no_fp8.output);
  BOOST_TEST(no_fp8.output.find("--fp8-trace " + trace.string() + ": the run has no fp8 layers") !=
                 std::string::npos,
             no_fp8.output);
}
