// ampkit-train --host-sync: the deferred step reads nothing on a healthy step and
// writes the same metrics, summary and checkpoints as the synchronous one, its records never lost
// (SIGTERM, an abort, a checkpoint every step); a strategy without a device form keeps the step
// synchronous and says so once.
#define BOOST_TEST_MODULE host_sync
#include <signal.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "train_process.h"

namespace fs = std::filesystem;

namespace {

using ampkit::test::count_lines;
using ampkit::test::read_json;
using ampkit::test::Result;
using ampkit::test::run;
using ampkit::test::running;
using ampkit::test::spawn;
using ampkit::test::TempDir;
using ampkit::test::tiny;
using ampkit::test::train;
using ampkit::test::wait_exit_code;
using ampkit::test::words;

// 300 fp16 steps of the tiny MLP with planted overflows (loss and gradient), a NaN inside a layer,
// a spike then a NaN, under the backoff policy and a norm clipper that clips.
const std::string faulty_run =
    tiny +
    " --precision fp16 --steps 300 --nan-policy backoff --clipper norm --opt clipper.max_norm=0.5"
    " --inject inf@step=20 --inject nan@step=77,layer=layers.1 --inject "
    "inf@step=150,layer=layers.0,target=grad"
    " --inject spike@step=200 --inject nan@step=201";

std::vector<nlohmann::json> metrics_without_timing(const fs::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    row.erase("time");
    row.erase("samples_per_second");
    if (row.contains("located"))  // each run writes its reports beside its own summary
      row["located"]["report"] = fs::path(row["located"]["report"].get<std::string>()).filename();
    rows.push_back(row);
  }
  return rows;
}

// The summary without what differs between two runs by design: timings, the step's mode, files.
nlohmann::json comparable_summary(const fs::path& file) {
  nlohmann::json s = read_json(file);
  for (const char* key : {"wall_seconds", "samples_per_second", "step", "checkpoint"}) s.erase(key);
  for (auto& report : s["nan_reports"])
    report["report"] = fs::path(report["report"].get<std::string>()).filename();
  return s;
}

// A checkpoint's content: its PyTorch-format files byte for byte, and its manifest without the
// command line and the file digests (LibTorch's optimizer archive keys its state by address).
std::string checkpoint_content(const fs::path& dir) {
  nlohmann::json m = read_json(dir / "manifest.json");
  m.erase("config");
  m.erase("files");
  std::string content = m.dump();
  for (const char* file : {"model.pt", "optimizer_state_dict.pt", "scaler_state_dict.pt"}) {
    std::ifstream in(dir / file, std::ios::binary);
    content += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return content;
}

struct Run {
  Result result;
  fs::path dir;
};

Run train_in(const fs::path& dir, const std::string& args) {
  fs::create_directories(dir);
  const std::string files =
      " --metrics " + (dir / "m.jsonl").string() + " --summary " + (dir / "s.json").string();
  return {run(args + files), dir};
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_deferred_step_writes_what_the_synchronous_one_writes_without_a_host_read) {
  TempDir tmp;
  const std::string ckpt = " --checkpoint-every 50 --checkpoint-dir ";
  const Run step =
      train_in(tmp.path / "step", faulty_run + " --host-sync step" + ckpt + (tmp.path / "step/ck").string());
  const Run deferred = train_in(tmp.path / "deferred", faulty_run + " --host-sync deferred" + ckpt +
                                                           (tmp.path / "deferred/ck").string());
  BOOST_REQUIRE_MESSAGE(step.result.code == 0, step.result.output);
  BOOST_REQUIRE_MESSAGE(deferred.result.code == 0, deferred.result.output);
  const auto a = metrics_without_timing(step.dir / "m.jsonl"),
             b = metrics_without_timing(deferred.dir / "m.jsonl");
  BOOST_TEST(a.size() == 300u);
  BOOST_REQUIRE(a.size() == b.size());
  int skipped = 0, clipped = 0, backoffs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST(a[i] == b[i], "step " << i << ":\n" << a[i].dump() << "\n" << b[i].dump());
    skipped += !a[i]["stepped"].get<bool>();
    clipped += a[i]["clipped"].get<bool>();
    backoffs += a[i]["action"] == "skip_backoff";
  }
  BOOST_TEST(skipped == 5);  // every planted fault, and nothing else
  BOOST_TEST(backoffs >= 1);
  BOOST_TEST(clipped > 100);
  BOOST_TEST(comparable_summary(step.dir / "s.json") == comparable_summary(deferred.dir / "s.json"));
  const nlohmann::json sync_step = read_json(step.dir / "s.json")["step"],
                       deferred_step = read_json(deferred.dir / "s.json")["step"];
  BOOST_TEST(sync_step["host_sync"] == "step");
  BOOST_TEST(deferred_step["host_sync"] == "deferred");
  BOOST_TEST(sync_step["host_reads"] == 300);  // one per step
  BOOST_TEST(deferred_step["host_reads"] == 0);
  for (const char* name : {"step-200", "step-250", "step-300"})
    BOOST_TEST((checkpoint_content(step.dir / "ck" / name) == checkpoint_content(deferred.dir / "ck" / name)),
               name);
  BOOST_TEST(deferred.result.output.find("stays synchronous") == std::string::npos, deferred.result.output);
}

BOOST_AUTO_TEST_CASE(a_deferred_run_resumes_into_the_synchronous_run) {
  TempDir tmp;
  const std::string ck = " --checkpoint-dir " + (tmp.path / "ck").string();
  const Run first =
      train_in(tmp.path / "a", faulty_run + " --host-sync deferred --checkpoint-every 100" + ck);
  BOOST_REQUIRE_MESSAGE(first.result.code == 0, first.result.output);
  const Run resumed = train_in(
      tmp.path / "b", faulty_run + " --host-sync step --resume " + (tmp.path / "ck/step-100").string());
  BOOST_REQUIRE_MESSAGE(resumed.result.code == 0, resumed.result.output);
  BOOST_TEST(read_json(resumed.dir / "s.json")["param_sha256"] ==
             read_json(first.dir / "s.json")["param_sha256"]);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_every_step_holds_each_steps_state) {
  TempDir tmp;
  const std::string args = tiny +
                           " --precision fp16 --steps 30 --nan-policy backoff --clipper norm"
                           " --opt clipper.max_norm=0.5 --inject inf@step=12";
  const std::string every = " --checkpoint-every 1 --keep-checkpoints 40 --checkpoint-dir ";
  const Run step =
      train_in(tmp.path / "step", args + " --host-sync step" + every + (tmp.path / "step/ck").string());
  const Run deferred = train_in(tmp.path / "deferred",
                                args + " --host-sync deferred" + every + (tmp.path / "deferred/ck").string());
  BOOST_REQUIRE_MESSAGE(deferred.result.code == 0, deferred.result.output);
  BOOST_REQUIRE_MESSAGE(step.result.code == 0, step.result.output);
  BOOST_TEST(metrics_without_timing(step.dir / "m.jsonl") ==
             metrics_without_timing(deferred.dir / "m.jsonl"));
  for (int i = 1; i <= 30; ++i) {
    const std::string name = "step-" + std::to_string(i);
    BOOST_TEST((checkpoint_content(step.dir / "ck" / name) == checkpoint_content(deferred.dir / "ck" / name)),
               name);
  }
}

BOOST_AUTO_TEST_CASE(an_abort_at_the_minimum_scale_keeps_every_record) {
  TempDir tmp;
  // Every step overflows from step 5: the scale halves to min_scale, where the scaler stops the run.
  std::string args = tiny +
                     " --precision fp16 --steps 40 --opt scaler.init_scale=64 --opt scaler.min_scale=8"
                     " --opt scaler.on_min_scale=error";
  for (int s = 5; s < 40; ++s) args += " --inject inf@step=" + std::to_string(s);
  const Run step = train_in(tmp.path / "step", args + " --host-sync step");
  const Run deferred = train_in(tmp.path / "deferred", args + " --host-sync deferred");
  BOOST_TEST(step.result.code == deferred.result.code);
  BOOST_TEST(step.result.code != 0, step.result.output);
  const auto a = metrics_without_timing(step.dir / "m.jsonl"),
             b = metrics_without_timing(deferred.dir / "m.jsonl");
  BOOST_TEST(a.size() < 40u);
  BOOST_TEST(a == b);
  for (size_t i = 0; i < b.size(); ++i) BOOST_TEST(b[i]["step"] == i);
  BOOST_TEST(read_json(deferred.dir / "s.json")["status"] == "aborted");
  BOOST_TEST(comparable_summary(step.dir / "s.json") == comparable_summary(deferred.dir / "s.json"));
}

BOOST_AUTO_TEST_CASE(sigterm_leaves_every_deferred_record_in_order) {
  TempDir tmp;
  // Wide enough that 3000 steps outlast the signal.
  const std::string wide =
      train + " " + ampkit::test::base_args + " --synthetic-width 64 --synthetic-depth 2";
  const fs::path metrics = tmp.path / "m.jsonl", summary = tmp.path / "s.json";
  std::vector<std::string> argv;
  for (const auto& w : words(wide +
                             " --precision fp16 --steps 3000 --host-sync deferred"
                             " --checkpoint-dir " +
                             (tmp.path / "ck").string() + " --metrics " + metrics.string() + " --summary " +
                             summary.string()))
    argv.push_back(w);
  const pid_t pid = spawn(argv, tmp.path / "log.txt");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 50 && running(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGTERM);
  BOOST_REQUIRE_EQUAL(wait_exit_code(pid), 130);
  const nlohmann::json s = read_json(summary);
  BOOST_TEST(s["step"]["host_sync"] == "deferred");
  const auto rows = metrics_without_timing(metrics);
  BOOST_TEST(rows.size() == s["steps"].get<size_t>());
  for (size_t i = 0; i < rows.size(); ++i) BOOST_TEST(rows[i]["step"] == i);
  const fs::path last = tmp.path / "ck" / ("step-" + std::to_string(rows.size()));
  BOOST_TEST(fs::exists(last));
  // The checkpoint holds the last recorded step: resuming it to 3000 steps ends where a run without
  // the signal ends.
  const Run resumed =
      train_in(tmp.path / "resumed",
               wide + " --precision fp16 --steps 3000 --host-sync step --resume " + last.string());
  const Run straight =
      train_in(tmp.path / "straight", wide + " --precision fp16 --steps 3000 --host-sync step");
  BOOST_REQUIRE_MESSAGE(resumed.result.code == 0, resumed.result.output);
  BOOST_TEST(read_json(resumed.dir / "s.json")["param_sha256"] ==
             read_json(straight.dir / "s.json")["param_sha256"]);
}

BOOST_AUTO_TEST_CASE(a_strategy_without_a_device_form_keeps_the_step_synchronous_and_says_so_once) {
  TempDir tmp;
  const Run r = train_in(tmp.path, tiny + " --steps 20 --host-sync deferred --nan-policy rollback");
  BOOST_REQUIRE_MESSAGE(r.result.code == 0, r.result.output);
  const std::string line = "warning: the step stays synchronous: nan_policy 'rollback' has no device form";
  const size_t at = r.result.output.find(line);
  BOOST_TEST(at != std::string::npos, r.result.output);
  BOOST_TEST(r.result.output.find(line, at + 1) == std::string::npos, r.result.output);
  const nlohmann::json s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["step"]["host_sync"] == "step");
  BOOST_TEST(s["step"]["host_reads"] == 20);
  BOOST_TEST(s["warnings"].dump().find("nan_policy 'rollback' has no device form") != std::string::npos);
  // The other reasons: another optimizer, and auto on the CPU (no line: nothing was asked for).
  const Run sgd = train_in(tmp.path / "sgd", tiny + " --steps 3 --host-sync deferred --optimizer sgd");
  BOOST_TEST(sgd.result.output.find("stays synchronous: the optimizer does not take grad_scale") !=
                 std::string::npos,
             sgd.result.output);
  const Run automatic = train_in(tmp.path / "auto", tiny + " --steps 3");
  BOOST_TEST(automatic.result.output.find("stays synchronous") == std::string::npos, automatic.result.output);
  BOOST_TEST(read_json(automatic.dir / "s.json")["step"]["host_sync_reason"].get<std::string>().find(
                 "auto on the CPU") == 0);
}

BOOST_AUTO_TEST_CASE(print_config_names_the_recipe_and_the_host_sync) {
  Result r = run(tiny + " --print-config");
  BOOST_REQUIRE_EQUAL(r.code, 0);
  BOOST_TEST(r.output.find("statistics recipe  fused_scan  ") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("host sync          step        (auto on the CPU)") != std::string::npos,
             r.output);
  r = run(tiny + " --print-config --host-sync deferred --optimizer sgd");
  BOOST_TEST(r.output.find("host sync          step        (--optimizer sgd takes no grad_scale") !=
                 std::string::npos,
             r.output);
  r = run(tiny + " --print-config --host-sync deferred");
  BOOST_TEST(r.output.find("host sync          deferred    (where every strategy has a device form") !=
                 std::string::npos,
             r.output);
}
