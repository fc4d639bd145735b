// Data-parallel training across processes with comm gloo: parity with one rank, identical NaN
// decisions, lost ranks, the launcher, and the checks on the job layout. Cases labelled "slow"
// are disabled by default and run by the ctest test test_distributed_slow (--run_test=@slow).
#define BOOST_TEST_MODULE distributed
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "free_port.h"
#include "test_paths.h"
#include "train_process.h"

using namespace ampkit::test;

namespace {

const std::string launch = std::string(ampkit::test::bin_dir()) + "/ampkit-launch";

std::vector<nlohmann::json> records(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Worst relative difference of a metric between two runs, step by step.
double max_rel_diff(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                    const std::string& key) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i][key].get<double>(), y = b[i][key].get<double>();
    worst = std::max(worst, std::abs(x - y) / std::max(std::abs(x), 1e-30));
  }
  return worst;
}

struct Parity {
  double loss = 0, grad_norm = 0;
  nlohmann::json summary, one_summary;
};

// The same global batch on 1 rank and on 2 ranks (batch B each). The 1-rank run trains on batch
// 2B, or with `halves` on the same two half-batches that the ranks get, accumulated (rank r's
// slice of global batch i is the 1-rank run's micro-batch 2i + r).
Parity one_vs_two(const std::string& args, int batch, int steps, const TempDir& tmp, const std::string& tag,
                  bool halves = false) {
  const fs::path one = tmp.path / (tag + "-1.jsonl"), two = tmp.path / (tag + "-2.jsonl");
  const fs::path one_summary = tmp.path / (tag + "-1.json"), summary = tmp.path / (tag + "-2.json");
  const std::string common = args + " --progress never --threads 1 --steps " + std::to_string(steps);
  const std::string one_batch =
      halves ? std::to_string(batch) + " --accumulate 2" : std::to_string(2 * batch);
  const Result a = run(train + " " + common + " --batch-size " + one_batch + " --metrics " + one.string() +
                       " --summary " + one_summary.string());
  BOOST_REQUIRE_MESSAGE(a.code == 0, a.output);
  // --check-ranks: these tests prove that the ranks agree, so every step's decision is cross-checked.
  const Result b =
      run(launch + " --nproc-per-node 2 --master-port " + std::to_string(ampkit::test::free_port()) + " -- " +
          train + " " + common + " --check-ranks --batch-size " + std::to_string(batch) + " --metrics " +
          two.string() + " --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(b.code == 0, b.output);
  const auto ra = records(one), rb = records(two);
  BOOST_REQUIRE_EQUAL(ra.size(), static_cast<size_t>(steps));
  Parity p;
  p.loss = max_rel_diff(ra, rb, "loss");
  p.grad_norm = max_rel_diff(ra, rb, "grad_norm");
  p.summary = read_json(summary);
  p.one_summary = read_json(one_summary);
  return p;
}

const std::string mlp =
    "--workload synthetic --synthetic-inputs 32 --synthetic-width 64 --synthetic-depth 3 --seed 4";

}  // namespace

BOOST_AUTO_TEST_CASE(mlp_fp32_two_ranks_follow_one_rank_step_for_step) {
  TempDir tmp;
  const Parity p = one_vs_two(mlp, 32, 100, tmp, "mlp");
  BOOST_TEST_MESSAGE("fp32 MLP, 100 steps: max rel diff loss " << p.loss << ", grad norm " << p.grad_norm);
  BOOST_TEST(p.loss < 1e-5);
  BOOST_TEST(p.grad_norm < 1e-5);
  BOOST_TEST(p.summary["world_size"].get<int>() == 2);
  BOOST_TEST(p.summary["ranks_identical"].get<bool>());
  BOOST_TEST(p.summary["plugins"]["comm"]["name"].get<std::string>() == "gloo");
  BOOST_TEST(p.summary["rank_samples_per_second"].size() == 2u);
}

BOOST_AUTO_TEST_CASE(accumulated_steps_communicate_once_and_match_one_rank) {
  TempDir tmp;
  const Parity p = one_vs_two(mlp + " --accumulate 3", 16, 20, tmp, "acc");
  BOOST_TEST_MESSAGE("fp32 MLP, accumulate 3: max rel diff loss " << p.loss);
  BOOST_TEST(p.loss < 1e-5);
  BOOST_TEST(p.grad_norm < 1e-5);
}

BOOST_AUTO_TEST_CASE(mlp_bf16_two_ranks_within_documented_tolerance) {
  TempDir tmp;
  const Parity p = one_vs_two(mlp + " --precision bf16", 32, 100, tmp, "bf16");
  // docs/distributed-training.md: bf16 rounds each rank's half-batch matmuls differently.
  BOOST_TEST_MESSAGE("bf16 MLP, 100 steps: max rel diff loss " << p.loss << ", grad norm " << p.grad_norm);
  BOOST_TEST(p.loss < 2e-3);
  BOOST_TEST(p.summary["ranks_identical"].get<bool>());
}

BOOST_AUTO_TEST_CASE(cnn_fp32_two_ranks_follow_one_rank_step_for_step,
                     *boost::unit_test::label("slow") * boost::unit_test::disabled()) {
  TempDir tmp;
  // Against 1 rank accumulating the same two half-batches: each rank's backward is then the same
  // computation as one micro-batch's, (g0 + g1) / 2 equals g0 / 2 + g1 / 2 exactly, and the runs
  // must agree bit for bit, AdamW included. Against one batch of 32 the CNN is chaotic: ReLU and
  // max-pool decisions flip on last-bit differences and the gap grows to 1e-5..1e-3 within 100
  // steps depending on the seed (docs/distributed-training.md), so that comparison cannot tell a
  // DDP bug from rounding; this one can.
  const Parity p =
      one_vs_two("--workload fashion-mnist --seed 2 --eval-batches 1", 16, 100, tmp, "cnn", true);
  BOOST_TEST_MESSAGE("fp32 CNN, 100 steps: max rel diff loss " << p.loss << ", grad norm " << p.grad_norm);
  BOOST_TEST(p.loss == 0.0);
  BOOST_TEST(p.grad_norm == 0.0);
  BOOST_TEST(p.summary["param_sha256"].get<std::string>() ==
             p.one_summary["param_sha256"].get<std::string>());
  BOOST_TEST(p.summary["ranks_identical"].get<bool>());
}

BOOST_AUTO_TEST_CASE(nan_on_one_rank_is_skipped_by_both) {
  TempDir tmp;
  const fs::path metrics = tmp.path / "m.jsonl", summary = tmp.path / "s.json";
  const Result r = run(launch + " --nproc-per-node 2 --master-port " +
                       std::to_string(ampkit::test::free_port()) + " -- " + train + " " + mlp +
                       " --progress never --threads 1 --steps 12 --batch-size 16 --inject nan@step=5,rank=1" +
                       " --check-ranks" + " --nan-report-dir " + tmp.path.string() + " --metrics " +
                       metrics.string() + " --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = read_json(summary);
  BOOST_TEST(s["skipped_steps"].get<int>() == 1);
  BOOST_TEST(s["ranks_identical"].get<bool>());
  BOOST_TEST(s["param_sha256_ranks"][0].get<std::string>() == s["param_sha256"].get<std::string>());
  const auto m = records(metrics);
  BOOST_REQUIRE_EQUAL(m.size(), 12u);
  BOOST_TEST(m[5]["found_inf"].get<bool>());
  BOOST_TEST(!m[5]["stepped"].get<bool>());
  for (size_t i = 0; i < m.size(); ++i)
    if (i != 5) BOOST_TEST(m[i]["stepped"].get<bool>());
  // Both ranks saw the bad step and re-ran it for the locator, without any communication.
  BOOST_TEST(r.output.find("[rank 0] ampkit-train: step 5: non-finite loss") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("[rank 1] ampkit-train: step 5: non-finite loss") != std::string::npos, r.output);
  BOOST_TEST(fs::exists(tmp.path / "nan-report-step-5-rank-1.json"));
  // The summary (rank 0's file) has every rank's report, tagged with its rank: rank 1's located
  // the fault, rank 0's could not (its own half-batch was healthy).
  BOOST_REQUIRE_EQUAL(s["nan_reports"].size(), 2u);
  for (const auto& report : s["nan_reports"]) {
    const int rank = report["rank"].get<int>();
    BOOST_TEST(report["step"].get<int>() == 5);
    BOOST_TEST(report["located"].get<bool>() == (rank == 1), report.dump());
    BOOST_TEST(report["report"].get<std::string>() ==
               (tmp.path / ("nan-report-step-5-rank-" + std::to_string(rank) + ".json")).string());
  }
  BOOST_TEST(s["nan_reports"][0]["rank"].get<int>() != s["nan_reports"][1]["rank"].get<int>());
  // The report that located the fault comes first, whatever its rank, and the summary names it.
  BOOST_TEST(s["nan_reports"][0]["rank"].get<int>() == 1, s["nan_reports"].dump());
  BOOST_TEST(s["nan_reports"][0]["located"].get<bool>(), s["nan_reports"].dump());
  const nlohmann::json located_by = s.contains("located_by") ? s["located_by"] : nlohmann::json();
  BOOST_TEST(located_by.dump() == "1", s.dump());
  BOOST_TEST(r.output.find("not located: not located") == std::string::npos, r.output);
}

// The rows of a metrics file without wall-clock fields, a located report by its file name.
std::vector<nlohmann::json> comparable_records(const fs::path& file) {
  std::vector<nlohmann::json> rows = records(file);
  for (auto& row : rows) {
    for (const char* key : {"time", "samples_per_second", "rank_samples_per_second"}) row.erase(key);
    if (row.contains("located"))
      row["located"]["report"] = fs::path(row["located"]["report"].get<std::string>()).filename();
  }
  return rows;
}

// The deferred step on two ranks through ampkit-train: --host-sync deferred writes every metric and summary
// field that --host-sync step writes, with no host read; rank 1's NaN and rank 0's overflow are
// skipped by both ranks, each located on both (the locator's re-run of the previous step, then
// this step's backward again, in step on both ranks).
BOOST_AUTO_TEST_CASE(two_deferred_ranks_write_what_two_synchronous_ranks_write_without_a_host_read) {
  TempDir tmp;
  std::map<std::string, std::pair<std::vector<nlohmann::json>, nlohmann::json>> runs;
  for (const std::string mode : {"step", "deferred"}) {
    const fs::path dir = tmp.path / mode;
    fs::create_directories(dir);
    const Result r =
        run(launch + " --nproc-per-node 2 --master-port " + std::to_string(ampkit::test::free_port()) +
            " -- " + train + " " + mlp + " --progress never --threads 1 --steps 40 --batch-size 16" +
            " --precision fp16 --nan-policy backoff --clipper norm --opt clipper.max_norm=0.2" +
            " --inject nan@step=5,rank=1 --inject inf@step=17,rank=0 --host-sync " + mode +
            " --nan-report-dir " + dir.string() + " --metrics " + (dir / "m.jsonl").string() + " --summary " +
            (dir / "s.json").string());
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
    BOOST_TEST(r.output.find("stays synchronous") == std::string::npos, r.output);
    for (const std::string step : {"5", "17"})
      for (const std::string rank : {"0", "1"})
        BOOST_TEST(r.output.find("[rank " + rank + "] ampkit-train: step " + step + ": non-finite") !=
                       std::string::npos,
                   mode << ", step " << step << ", rank " << rank << ":\n"
                        << r.output);
    runs[mode] = {comparable_records(dir / "m.jsonl"), read_json(dir / "s.json")};
  }
  const auto& [a, sa] = runs["step"];
  const auto& [b, sb] = runs["deferred"];
  BOOST_REQUIRE_EQUAL(a.size(), 40u);
  BOOST_REQUIRE_EQUAL(b.size(), 40u);
  int clipped = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST(a[i] == b[i], "step " << i << ":\n" << a[i].dump() << "\n" << b[i].dump());
    BOOST_TEST(a[i]["stepped"].get<bool>() == (i != 5 && i != 17), "step " << i);
    clipped += a[i]["clipped"].get<bool>();
  }
  BOOST_TEST(clipped > 5);
  BOOST_TEST(sa["step"]["host_sync"] == "step");
  BOOST_TEST(sb["step"]["host_sync"] == "deferred");
  // One read per synchronous step, none deferred; the run's own gathers (its settings and layout
  // checked, the summary's ranks) are the same few in both, but for the deferred run's one more: the
  // kernels' verdict agreed (every rank's reason empty, so their lengths only).
  BOOST_TEST(sa["step"]["host_reads"].get<int>() - sb["step"]["host_reads"].get<int>() == 40 - 1);
  BOOST_TEST(sb["ranks_identical"].get<bool>());
  BOOST_TEST(sa["param_sha256"] == sb["param_sha256"]);
  BOOST_TEST(sa["skipped_steps"] == sb["skipped_steps"]);
  BOOST_TEST(sa["nan_reports"].size() == 4u);
  BOOST_TEST(sb["nan_reports"].size() == 4u);
}

namespace {

struct Survivor {
  int code = -1;
  double seconds = 0;
  std::string log;
};

// Starts ranks 0 and 1 directly (no launcher), each with its own arguments after the common ones
// and its own environment variable where `env` names one ("NAME=VALUE").
std::vector<pid_t> spawn_two_ranks(const std::string& common, const std::array<std::string, 2>& own,
                                   const TempDir& tmp, const std::array<std::string, 2>& env = {}) {
  const int port = ampkit::test::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<std::string> args = {train};
    for (const auto& w : words(common + " " + own[static_cast<size_t>(r)])) args.push_back(w);
    const std::string& var = env[static_cast<size_t>(r)];
    const std::string var_name = var.substr(0, var.find('='));
    if (!var.empty()) ::setenv(var_name.c_str(), var.substr(var.find('=') + 1).c_str(), 1);
    pids.push_back(spawn(args, tmp.path / ("rank" + std::to_string(r) + ".log")));
    if (!var.empty()) ::unsetenv(var_name.c_str());
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  return pids;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Does `signal_number` to rank `victim` once the ranks train, times the other rank's exit.
Survivor lose_rank(int victim, int signal_number, int timeout_seconds) {
  TempDir tmp;
  const fs::path metrics = tmp.path / "m.jsonl";
  const std::vector<pid_t> pids =
      spawn_two_ranks(mlp + " --progress never --threads 1 --steps 1000000 --batch-size 8 --dist-timeout " +
                          std::to_string(timeout_seconds) + " --metrics " + metrics.string(),
                      {"", ""}, tmp);
  for (int i = 0; i < 300 && count_lines(metrics) < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  BOOST_REQUIRE(count_lines(metrics) >= 5);
  const size_t survivor = static_cast<size_t>(1 - victim);
  ::kill(pids[static_cast<size_t>(victim)], signal_number);
  const auto start = std::chrono::steady_clock::now();
  Survivor s;
  s.code = wait_exit_code(pids[survivor]);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(pids[static_cast<size_t>(victim)], SIGKILL);
  wait_exit_code(pids[static_cast<size_t>(victim)]);
  s.log = read_text(tmp.path / ("rank" + std::to_string(survivor) + ".log"));
  return s;
}

}  // namespace

// A lost rank 0 (the rendezvous store's host) once took twice the timeout (610 s with the
// default) and wrote 592 c10d stack traces; now either survivor exits 7 in seconds, in one line.
BOOST_AUTO_TEST_CASE(a_killed_rank_0_or_1_makes_the_survivor_exit_7_naming_it) {
  for (const int victim : {1, 0}) {
    const Survivor s = lose_rank(victim, SIGKILL, 20);
    BOOST_TEST_MESSAGE("rank " << victim << " killed: the other exited " << s.code << " after " << s.seconds
                               << " s, " << count_newlines(s.log) << " lines");
    BOOST_TEST(s.code == 7, s.log);
    BOOST_TEST(s.seconds < 20 + 10);
    BOOST_TEST(count_newlines(s.log) <= 5u, s.log);
    BOOST_TEST(s.log.find("ampkit-train: error: rank " + std::to_string(1 - victim) + ": lost rank " +
                          std::to_string(victim)) != std::string::npos,
               s.log);
  }
}

BOOST_AUTO_TEST_CASE(hung_rank_makes_the_survivor_exit_7_within_the_timeout) {
  const Survivor s = lose_rank(1, SIGSTOP, 4);
  BOOST_TEST_MESSAGE("rank 1 stopped: rank 0 exited " << s.code << " after " << s.seconds << " s");
  BOOST_TEST(s.code == 7, s.log);
  BOOST_TEST(s.seconds >= 4 - 0.5);  // it waited for the collective's timeout, not less
  BOOST_TEST(s.seconds < 4 + 10);
  BOOST_TEST(s.log.find("lost rank 1") != std::string::npos, s.log);
}

// A stopped rank 0 still holds its store's port: the peer's diagnosis used to wait on it forever.
BOOST_AUTO_TEST_CASE(a_stopped_rank_0_makes_the_peer_exit_7_within_the_timeout) {
  const Survivor s = lose_rank(0, SIGSTOP, 20);
  BOOST_TEST_MESSAGE("rank 0 stopped: rank 1 exited " << s.code << " after " << s.seconds << " s");
  BOOST_TEST(s.code == 7, s.log);
  BOOST_TEST(s.seconds < 20 + 10);
  BOOST_TEST(count_newlines(s.log) <= 5u, s.log);
  BOOST_TEST(s.log.find("ampkit-train: error: rank 1: lost rank 0") != std::string::npos, s.log);
}

namespace {

// Both ranks' exit codes and logs, for ranks started with different arguments.
struct Pair {
  int code[2] = {-1, -1};
  std::string log[2];
};

Pair two_ranks(const std::string& common, const std::array<std::string, 2>& own,
               const std::array<std::string, 2>& env = {}) {
  TempDir tmp;
  const std::vector<pid_t> pids = spawn_two_ranks(common, own, tmp, env);
  Pair p;
  for (int r = 0; r < 2; ++r) {
    p.code[r] = wait_exit_code(pids[static_cast<size_t>(r)]);
    p.log[r] = read_text(tmp.path / ("rank" + std::to_string(r) + ".log"));
  }
  return p;
}

}  // namespace

// One verdict on ampkit's kernels for all ranks: a first-use check that refuses them on rank 1 only
// (its statistics kernel's CPU stand-in planted wrong) makes both ranks take the synchronous step,
// rank 0 saying it for rank 1, and the run ends with --host-sync step's parameters. Each rank
// deciding alone left rank 0 on the deferred step and rank 1 on the synchronous one: on a GPU
// their sums of squares, and so their clip coefficients and parameters, differ in the last bits.
BOOST_AUTO_TEST_CASE(a_kernel_check_refused_on_one_rank_makes_both_ranks_fall_back) {
  TempDir tmp;
  const std::string common = mlp +
                             " --progress never --threads 1 --steps 20 --batch-size 16 --precision fp16"
                             " --clipper norm --opt clipper.max_norm=0.2 --dist-timeout 30 --summary ";
  std::map<std::string, nlohmann::json> summaries;
  for (const std::string mode : {"step", "deferred"}) {
    const std::string own = (tmp.path / (mode + ".json")).string() + " --host-sync " + mode;
    const Pair p = two_ranks(common + own, {"", ""}, {"", "AMPKIT_TEST_KERNEL_FAULT=stats"});
    for (int r = 0; r < 2; ++r) BOOST_REQUIRE_MESSAGE(p.code[r] == 0, "rank " << r << ":\n" << p.log[r]);
    summaries[mode] = read_json(tmp.path / (mode + ".json"));
    if (mode == "step") continue;
    const std::string said =
        "ampkit-train: warning: the step stays synchronous: rank 1: the CPU stand-ins of "
        "ampkit's kernels: the statistics kernel disagrees with its host form";
    BOOST_TEST(p.log[0].find(said) != std::string::npos, p.log[0]);
  }
  const nlohmann::json& sync = summaries["step"];
  const nlohmann::json& deferred = summaries["deferred"];
  BOOST_TEST(deferred["step"]["host_sync"] == "step", deferred.dump());
  BOOST_TEST(deferred["step"]["host_sync_reason"].get<std::string>().find("rank 1: ") != std::string::npos);
  BOOST_TEST(deferred["ranks_identical"].get<bool>());
  BOOST_TEST(deferred["param_sha256"] == sync["param_sha256"]);
  // One read per step in both runs; the deferred run's two more are the verdicts' gathers (lengths, text).
  BOOST_TEST(deferred["step"]["host_reads"].get<int>() - sync["step"]["host_reads"].get<int>() == 2);
}

// Ranks started with different settings are refused right after the rendezvous, on every rank,
// naming each setting with the ranks' values: a different --precision passed unnoticed, a
// different --steps aborted a collective at the end (SIGABRT), a different --lr or clipper option
// diverged silently. A different clipper has other option names altogether.
BOOST_AUTO_TEST_CASE(ranks_started_with_different_settings_exit_7_before_the_first_step) {
  const std::string common = mlp + " --progress never --threads 1 --batch-size 8 --dist-timeout 20";
  const std::vector<std::pair<std::array<std::string, 2>, std::string>> cases = {
      {{"--steps 3", "--steps 4"}, "--steps (rank 0: 3, rank 1: 4)"},
      {{"--steps 3 --precision fp32", "--steps 3 --precision bf16"},
       "--precision (rank 0: fp32, rank 1: bf16)"},
      {{"--steps 3 --lr 0.001", "--steps 3 --lr 0.002"}, "--lr (rank 0: 0.001, rank 1: 0.002)"},
      {{"--steps 3 --clipper norm --opt clipper.max_norm=1",
        "--steps 3 --clipper norm --opt clipper.max_norm=2"},
       "clipper.max_norm (rank 0: 1, rank 1: 2)"},
      {{"--steps 3 --clipper norm", "--steps 3 --clipper value"},
       "--clipper (rank 0: norm, rank 1: value), clipper.max_norm (rank 0: 10, rank 1: not set)"},
  };
  for (const auto& [own, names] : cases) {
    TempDir tmp;
    const fs::path metrics = tmp.path / "m.jsonl";
    const auto start = std::chrono::steady_clock::now();
    const Pair p = two_ranks(common + " --metrics " + metrics.string(), own);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE(names << ": both ranks exited after " << seconds << " s");
    BOOST_TEST(seconds < 20);                // nobody waited for a collective's timeout
    BOOST_TEST(count_lines(metrics) == 0u);  // before the first step
    for (int r = 0; r < 2; ++r) {
      BOOST_TEST(p.code[r] == 7, "rank " << r << ":\n" << p.log[r]);
      BOOST_TEST(p.log[r].find("ampkit-train: error: the ranks were started with different settings: " +
                               names) != std::string::npos,
                 p.log[r]);
      BOOST_TEST(count_newlines(p.log[r]) == 1u, p.log[r]);
    }
  }
}

BOOST_AUTO_TEST_CASE(launcher_prefixes_ranks_and_stops_all_when_one_fails) {
  // --max-restarts does not restart a usage error: the same arguments would fail the same way.
  const Result r = run(launch + " --nproc-per-node 2 --max-restarts 2 --master-port " +
                       std::to_string(ampkit::test::free_port()) + " -- " + train + " " + mlp +
                       " --steps 2 --inject nan@step=0,rank=7");
  BOOST_TEST(r.code == 2, r.output);
  BOOST_TEST(r.output.find("restart 1") == std::string::npos, r.output);
  // Both ranks reject the spec before the rendezvous; whichever exits first, the launcher names it.
  BOOST_TEST(r.output.find("] ampkit-train: error: --inject 'nan@step=0,rank=7': rank 7 does not exist") !=
                 std::string::npos,
             r.output);
  BOOST_TEST(r.output.find("exited with code 2 at ") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("; stopping the other ranks (SIGTERM, SIGKILL after 30 s)") != std::string::npos,
             r.output);
  BOOST_TEST(r.output.find("still running") == std::string::npos, r.output);  // nobody was left waiting
  BOOST_TEST(r.output.find("ampkit-launch: rank ") != std::string::npos, r.output);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--max-restarts -1 -- true", "--max-restarts must be in [0, 1000], got -1"},
           {"--nnodes 2 --master-port 0 -- true",
            "--master-port 0 picks a port on this node only; with --nnodes 2 give every node's launcher the "
            "same "
            "free port"}}) {
    const Result bad = run(launch + " " + args);
    BOOST_TEST(bad.code == 2, bad.output);
    BOOST_TEST(bad.output == "ampkit-launch: error: " + message + "\n", bad.output);
  }
  const Result none = run(launch + " --nproc-per-node 2");
  BOOST_TEST(none.code == 2);
  BOOST_TEST(none.output.find("ampkit-launch: error: no program given") != std::string::npos, none.output);
  // A program that cannot be started is exit 7, as documented (it was the shell's 127).
  const Result missing = run(launch + " --nproc-per-node 2 -- /nonexistent/prog");
  BOOST_TEST(missing.code == 7, missing.output);
  BOOST_TEST(
      missing.output.find("ampkit-launch: error: cannot run /nonexistent/prog: No such file or directory") !=
          std::string::npos,
      missing.output);
}

// --grace-seconds inf (or 1e19) overflowed the SIGKILL deadline: the survivors were killed after
// about a second while the launcher said "still running inf s after SIGTERM". Out of [0, 86400]
// is now a usage error, one line, exit 2; the bound itself still lets the survivors exit on SIGTERM.
BOOST_AUTO_TEST_CASE(launcher_grace_seconds_is_range_checked) {
  for (const std::string value : {"inf", "nan", "1e19", "1e300", "-1", "86400.5"}) {
    const Result bad = run(launch + " --grace-seconds " + value + " -- true");
    BOOST_TEST(bad.code == 2, value << ": " << bad.output);
    const std::string shown = value == "1e19" ? "1e+19" : value == "1e300" ? "1e+300" : value;
    BOOST_TEST(
        bad.output == "ampkit-launch: error: --grace-seconds must be in [0, 86400], got " + shown + "\n",
        bad.output);
  }
  const Result zero = run(launch + " --grace-seconds 0 --master-port " +
                          std::to_string(ampkit::test::free_port()) + " -- true");
  BOOST_TEST(zero.code == 0, zero.output);
  // Rank 1 fails at once; rank 0 would sleep for a minute but exits on the SIGTERM, long before
  // the day of grace is over, and nobody is reported as still running.
  const Result bound = run(launch + " --nproc-per-node 2 --grace-seconds 86400 --master-port " +
                           std::to_string(ampkit::test::free_port()) +
                           " -- sh -c 'if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60'");
  BOOST_TEST(bound.code == 3, bound.output);
  BOOST_TEST(bound.output.find("ampkit-launch: rank 1 exited with code 3 at ") != std::string::npos,
             bound.output);
  BOOST_TEST(bound.output.find("(SIGTERM, SIGKILL after 86400 s)") != std::string::npos, bound.output);
  BOOST_TEST(bound.output.find("still running") == std::string::npos, bound.output);
  // The same overflow for the rank numbers: --nnodes x --nproc-per-node must fit the world size.
  const Result world = run(launch + " --nnodes 2147483647 --nproc-per-node 2 -- true");
  BOOST_TEST(world.code == 2, world.output);
  BOOST_TEST(
      world.output ==
          "ampkit-launch: error: --nnodes 2147483647 x --nproc-per-node 2 is more than 1048576 ranks\n",
      world.output);
}

namespace {

// The pid of the launcher's child that runs `rank` (read from its environment); -1 if none yet.
pid_t rank_pid(pid_t launcher, int rank) {
  std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) +
                         "/children");
  for (pid_t child; children >> child;) {
    std::ifstream env("/proc/" + std::to_string(child) + "/environ");
    const std::string text = '\0' + std::string(std::istreambuf_iterator<char>(env), {});
    if (text.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos) return child;
  }
  return -1;
}

std::string last_line(const std::string& text) {
  const size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace

// With ampkit-launch's defaults (30 s grace, 300 s --dist-timeout) a killed rank is named twice:
// by the survivor ("lost rank N", said within the grace period, before the launcher's SIGKILL) and
// by the launcher's last line.
BOOST_AUTO_TEST_CASE(the_launcher_names_the_failed_rank_and_the_survivor_says_it_was_lost) {
  for (const int victim : {1, 0}) {
    TempDir tmp;
    const fs::path metrics = tmp.path / "m.jsonl";
    std::vector<std::string> args = {launch, "--nproc-per-node", "2", "--master-port", "0", "--", train};
    for (const auto& w :
         words(mlp + " --progress never --threads 1 --batch-size 8 --steps 1000000 --metrics " +
               metrics.string()))
      args.push_back(w);
    const pid_t pid = spawn(args, tmp.path / "launch.log");
    for (int i = 0; i < 300 && count_lines(metrics) < 5; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    BOOST_REQUIRE(count_lines(metrics) >= 5);
    const pid_t victim_pid = rank_pid(pid, victim);
    BOOST_REQUIRE(victim_pid > 0);
    ::kill(victim_pid, SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    const int code = wait_exit_code(pid);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string out = read_text(tmp.path / "launch.log");
    BOOST_TEST_MESSAGE("rank " << victim << " killed under ampkit-launch: exit " << code << " after "
                               << seconds << " s; last line: " << last_line(out));
    BOOST_TEST(code == 137, out);
    BOOST_TEST(seconds < 30);
    const int survivor = 1 - victim;
    BOOST_TEST(
        out.find("[rank " + std::to_string(survivor) + "] ampkit-train: error: rank " +
                 std::to_string(survivor) + ": lost rank " + std::to_string(victim)) != std::string::npos,
        out);
    BOOST_TEST(last_line(out).rfind("ampkit-launch: failed: rank " + std::to_string(victim) +
                                        " was killed by signal 9 (Killed) at ",
                                    0) == 0,
               out);
    BOOST_TEST(out.find("still running") == std::string::npos, out);  // the survivor was not SIGKILLed
  }
}

// --max-restarts: a rank killed mid-run, every rank restarted from the newest checkpoint, and the
// result is the uninterrupted run's, bit for bit.
BOOST_AUTO_TEST_CASE(max_restarts_resumes_a_killed_job_to_the_uninterrupted_result) {
  TempDir tmp;
  const std::string job =
      mlp + " --progress never --threads 1 --batch-size 8 --steps 300 --checkpoint-every 10";
  const Result whole =
      run(launch + " --nproc-per-node 2 --master-port 0 -- " + train + " " + job + " --checkpoint-dir " +
          (tmp.path / "a").string() + " --summary " + (tmp.path / "a.json").string());
  BOOST_REQUIRE_MESSAGE(whole.code == 0, whole.output);
  const fs::path metrics = tmp.path / "m.jsonl";
  std::vector<std::string> args = {
      launch, "--nproc-per-node", "2", "--master-port", "0", "--max-restarts", "2", "--", train};
  for (const auto& w : words(job + " --checkpoint-dir " + (tmp.path / "b").string() + " --metrics " +
                             metrics.string() + " --summary " + (tmp.path / "b.json").string()))
    args.push_back(w);
  const pid_t pid = spawn(args, tmp.path / "launch.log");
  for (int i = 0; i < 3000 && count_lines(metrics) < 25; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const pid_t victim = rank_pid(pid, 1);
  BOOST_REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  const size_t killed_at = count_lines(metrics);
  const int code = wait_exit_code(pid);
  const std::string out = read_text(tmp.path / "launch.log");
  BOOST_TEST_MESSAGE("rank 1 killed after " << killed_at << " metrics records; launcher exit " << code);
  BOOST_REQUIRE_MESSAGE(code == 0, out);
  BOOST_TEST(killed_at < 300u);  // the kill landed mid-run
  const auto a = read_json(tmp.path / "a.json"), b = read_json(tmp.path / "b.json");
  BOOST_TEST(b["restarts"].get<int>() == 1);
  BOOST_TEST(a["restarts"].get<int>() == 0);
  BOOST_TEST(b["steps"].get<int64_t>() == 300);
  BOOST_TEST(b["param_sha256"].get<std::string>() == a["param_sha256"].get<std::string>());
  BOOST_TEST(b["ranks_identical"].get<bool>());
  BOOST_TEST(out.find("ampkit-launch: restart 1 of 2: starting 2 ranks again") != std::string::npos, out);
  BOOST_TEST(out.find("[rank 1] ampkit-train: resumed from") != std::string::npos, out);
  BOOST_TEST(last_line(out) == "ampkit-launch: every rank finished after 1 restart", out);
  // The metrics file holds each step once: the steps after the checkpoint were run again.
  const auto m = records(metrics);
  BOOST_REQUIRE_EQUAL(m.size(), 300u);
  for (size_t i = 0; i < m.size(); ++i) BOOST_TEST(m[i]["step"].get<size_t>() == i);
}

BOOST_AUTO_TEST_CASE(bad_job_layouts_and_a_busy_port_get_one_line_and_exit_2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK=2 WORLD_SIZE=2 " + train + " " + tiny_args, "rank 2 is outside world size 2"},
      {train + " " + tiny_args + " --world-size 2 --rank 0 --master-port 70000",
       "--master-port must be in [1, 65535], got 70000"},
      {train + " " + tiny_args + " --world-size 4 --nnodes 2 --nproc-per-node 3",
       "inconsistent node counts: nnodes 2 x nproc-per-node 3 != world size 4"},
      {"WORLD_SIZE=2 RANK=0 " + train + " " + tiny_args + " --comm local",
       "comm 'local' runs one process but the world size is 2"},
      {"RANK=x WORLD_SIZE=2 " + train + " " + tiny_args,
       "--rank must be an integer, got 'x' from environment (RANK)"},
      // torchrun's variables that contradict each other (once accepted, then a rendezvous failure)
      {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 " + train + " " + tiny_args,
       "inconsistent launcher environment: RANK=3 but GROUP_RANK=0 x LOCAL_WORLD_SIZE=2 + LOCAL_RANK=0 is 0"},
      {"RANK=0 WORLD_SIZE=4 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 " + train + " " + tiny_args,
       "local rank 2 is outside nproc-per-node 2"},
      {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 " + train + " " + tiny_args + " --node-rank 2",
       "node rank 2 is outside nnodes 2"},
      {"RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=3 " + train + " " + tiny_args,
       "inconsistent node counts: nnodes 1 x nproc-per-node 3 != world size 4"},
      {"RANK=0 WORLD_SIZE=2 TORCHELASTIC_RESTART_COUNT=-1 " + train + " " + tiny_args,
       "--restart-count must be in [0, 1048576], got -1 from environment (TORCHELASTIC_RESTART_COUNT)"},
  };
  for (const auto& [command, message] : cases) {
    const Result r = run(command);
    BOOST_TEST(r.code == 2, command << "\n" << r.output);
    BOOST_TEST(r.output.find("ampkit-train: error: " + message) != std::string::npos, r.output);
  }
  {
    // A busy --master-port on the store's node: one line before any rendezvous, not EADDRINUSE
    // from the store after the other ranks waited.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0);
    socklen_t length = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
    const std::string port = std::to_string(ntohs(a.sin_port));
    const auto start = std::chrono::steady_clock::now();
    const Result r = run("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + port + " " + train + " " + tiny_args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ::close(fd);
    BOOST_TEST(r.code == 2, r.output);
    BOOST_TEST(r.output == "ampkit-train: error: --master-port " + port +
                               " on this node (rank 0 hosts the rendezvous store there) is in use by another "
                               "program; pick a free port (ampkit-launch --master-port 0 picks one)\n",
               r.output);
    BOOST_TEST(seconds < 10);
  }
  if (!fs::exists("/dev/nvidia0")) {
    const Result r = run(train + " " + tiny_args + " --comm nccl");
    BOOST_TEST(r.code == 2, r.output);
    BOOST_TEST(r.output.find("comm 'nccl' needs CUDA") != std::string::npos, r.output);
  }
}

// A rank started with another MASTER_PORT, and an address that does not resolve: one line each,
// exit 7 within the timeout plus 10 s (once 48.6 s and a 37-line backtrace for the first,
// 40 lines of torch's log for the second).
BOOST_AUTO_TEST_CASE(a_wrong_port_or_address_fails_in_one_line_within_the_timeout) {
  TempDir tmp;
  const std::string common = tiny_args + " --steps 1000 --dist-timeout 5";
  // Rank 1's port is free now and is not the store's: free_port() moves on with every call.
  const std::vector<pid_t> pids =
      spawn_two_ranks(common, {"", "--master-port " + std::to_string(ampkit::test::free_port())}, tmp);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    const int code = wait_exit_code(pids[static_cast<size_t>(r)]);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string log = read_text(tmp.path / ("rank" + std::to_string(r) + ".log"));
    BOOST_TEST_MESSAGE("rank " << r << " (wrong port: " << (r == 1) << ") exited " << code << " after "
                               << seconds << " s: " << log);
    BOOST_TEST(code == 7, log);
    BOOST_TEST(seconds < 5 + 10);
    BOOST_TEST(count_newlines(log) == 1u, log);
    BOOST_TEST(log.find("ampkit-train: error: comm 'gloo': rendezvous at 127.0.0.1:") == 0, log);
  }
  const auto begin = std::chrono::steady_clock::now();
  const Result bad = run("RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid " + train + " " + tiny_args +
                         " --steps 1 --dist-timeout 5");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  BOOST_TEST(bad.code == 7, bad.output);
  BOOST_TEST(seconds < 5 + 10);
  BOOST_TEST(count_newlines(bad.output) == 1u, bad.output);
  BOOST_TEST(bad.output.find("ampkit-train: error: comm 'gloo': rendezvous at no-such-host.invalid:") == 0,
             bad.output);
}

// c10d's client connect retries for two rounds of its timeout, growing with
// it: a wrong MASTER_PORT took 373 s against the default --dist-timeout of 300. The client now
// waits for a listener itself, bounded by the timeout: within timeout + 2 s at 2 s and at 30 s
// (without the wait, 30 s took about 36 s).
// The time limit is the timeout plus what starting the program costs on this machine at this
// moment (measured: a --print-config run, which loads the same libraries and plugins), plus a
// second: a fixed 2 s margin failed under the sanitizers on 2 busy cores (4.56 s for a bound of 4).
BOOST_AUTO_TEST_CASE(rendezvous_nobody_joins_exits_7) {
  const auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (const int timeout : {2, 30}) {
    const std::string job = "RANK=1 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(ampkit::test::free_port()) +
                            " " + train + " " + tiny_args + " --steps 1 --dist-timeout " +
                            std::to_string(timeout);
    auto start = std::chrono::steady_clock::now();
    BOOST_REQUIRE_EQUAL(run(job + " --print-config").code, 0);
    const double startup = seconds_since(start);
    start = std::chrono::steady_clock::now();
    const Result r = run(job);
    const double seconds = seconds_since(start);
    BOOST_TEST_CONTEXT("--dist-timeout " << timeout << ": " << seconds << " s, start-up " << startup
                                         << " s") {
      BOOST_TEST(r.code == 7, r.output);
      BOOST_TEST(
          r.output.find("ampkit-train: error: comm 'gloo': rendezvous at 127.0.0.1:") != std::string::npos,
          r.output);
      BOOST_TEST(r.output.find("nothing accepted a connection there within --dist-timeout " +
                               std::to_string(timeout) + " s") != std::string::npos,
                 r.output);
      // It waited for --dist-timeout, and not for the default 300 s. The start-up is measured on a
      // separate run: on a loaded machine the second start can take twice as long.
      BOOST_TEST(seconds >= timeout);
      BOOST_TEST(seconds < timeout + 2 * startup + 10.0);
      BOOST_TEST(count_newlines(r.output) == 1u, r.output);
    }
  }
}

// The --print-config line of a setting: "NAME  VALUE  (SOURCE)".
bool has_setting(const std::string& output, const std::string& name, const std::string& value,
                 const std::string& source) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const auto w = words(line);
    if (w.size() >= 3 && w[0] == name && w[1] == value && line.find("(" + source + ")") != std::string::npos)
      return true;
  }
  return false;
}

BOOST_AUTO_TEST_CASE(launchers_environment_is_read_with_its_source) {
  const Result slurm =
      run("SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_NNODES=2 "
          "SLURM_NTASKS_PER_NODE='2(x2)' SLURM_JOB_NODELIST='gpu[07-08]' " +
          train + " --print-config");
  BOOST_REQUIRE_MESSAGE(slurm.code == 0, slurm.output);
  BOOST_TEST(has_setting(slurm.output, "rank", "1", "environment (SLURM_PROCID)"), slurm.output);
  BOOST_TEST(has_setting(slurm.output, "world-size", "4", "environment (SLURM_NTASKS)"));
  BOOST_TEST(has_setting(slurm.output, "nproc-per-node", "2", "environment (SLURM_NTASKS_PER_NODE)"));
  BOOST_TEST(has_setting(slurm.output, "nnodes", "2", "environment (SLURM_NNODES)"));
  BOOST_TEST(has_setting(slurm.output, "master-addr", "gpu07", "environment (SLURM_JOB_NODELIST)"));
  BOOST_TEST(has_setting(slurm.output, "comm", "gloo", "default (world size 4 on cpu)"));
  // torchrun's variables win over SLURM's and Open MPI's; the command line wins over all.
  const Result both = run("RANK=3 SLURM_PROCID=1 WORLD_SIZE=2 OMPI_COMM_WORLD_SIZE=8 " + train +
                          " --print-config --world-size 4 --comm gloo");
  BOOST_REQUIRE_MESSAGE(both.code == 0, both.output);
  BOOST_TEST(has_setting(both.output, "rank", "3", "environment (RANK)"), both.output);
  BOOST_TEST(has_setting(both.output, "world-size", "4", "command line"));
  const Result mpi = run("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 " +
                         train + " --print-config");
  BOOST_TEST(has_setting(mpi.output, "rank", "1", "environment (OMPI_COMM_WORLD_RANK)"), mpi.output);
  BOOST_TEST(has_setting(mpi.output, "local-rank", "1", "environment (OMPI_COMM_WORLD_LOCAL_RANK)"));
  BOOST_TEST(has_setting(mpi.output, "comm", "gloo", "default (world size 2 on cpu)"));
}

// torchrun's agent serves the TCP store on MASTER_PORT itself (TORCHELASTIC_USE_AGENT_STORE):
// rank 0 joins it as a client, as torch.distributed does, instead of binding the agent's port.
BOOST_AUTO_TEST_CASE(torchrun_and_its_agent_store) {
  if (run("python3 -c 'import torch.distributed.run'").code != 0) {
    BOOST_TEST_MESSAGE("skipped: python3 has no torch (tools/setup.sh installs it)");
    return;
  }
  TempDir tmp;
  const fs::path summary = tmp.path / "s.json";
  const Result r = run("python3 -m torch.distributed.run --nproc-per-node 2 --master-port " +
                       std::to_string(ampkit::test::free_port()) + " --no-python " + train + " " + tiny_args +
                       " --steps 5 --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = read_json(summary);
  BOOST_TEST(s["world_size"].get<int>() == 2);
  BOOST_TEST(s["ranks_identical"].get<bool>());
  BOOST_TEST(s["restarts"].get<int>() == 0);
}

BOOST_AUTO_TEST_CASE(file_store_rendezvous_on_a_shared_path) {
  TempDir tmp;
  const fs::path summary = tmp.path / "s.json";
  const Result r =
      run(launch + " --nproc-per-node 2 -- " + train + " " + tiny_args +
          " --steps 5 --rendezvous file:" + (tmp.path / "store").string() + " --summary " + summary.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  BOOST_TEST(read_json(summary)["ranks_identical"].get<bool>());
  const Result bad = run(train + " " + tiny_args + " --rendezvous nfs");
  BOOST_TEST(bad.code == 2);
  BOOST_TEST(bad.output.find("--rendezvous must be tcp or file:PATH, got 'nfs'") != std::string::npos,
             bad.output);
}

// Both steps: the synchronous one agrees on the stop with the signalled step's values, the deferred
// one with its record one step later; either way every step's metrics row is written, in order.
BOOST_AUTO_TEST_CASE(sigterm_to_the_launcher_stops_all_ranks_after_one_step_and_resumes) {
  TempDir tmp;
  const fs::path ckpt = tmp.path / "ckpt", metrics = tmp.path / "m.jsonl";
  int64_t stopped = 0;
  for (const std::string mode : {"step", "deferred"}) {
    BOOST_TEST_CONTEXT("--host-sync " << mode) {
      fs::remove_all(ckpt);
      fs::remove(metrics);
      const std::string port = std::to_string(ampkit::test::free_port());
      std::vector<std::string> args = {launch, "--nproc-per-node", "2", "--master-port", port, "--", train};
      for (const auto& w :
           words(mlp + " --progress never --threads 1 --batch-size 8 --steps 1000000 --host-sync " + mode +
                 " --checkpoint-dir " + ckpt.string() + " --metrics " + metrics.string() + " --summary " +
                 (tmp.path / "a.json").string()))
        args.push_back(w);
      const pid_t pid = spawn(args, tmp.path / "launch.log");
      for (int i = 0; i < 300 && count_lines(metrics) < 5; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(pid, SIGTERM);
      BOOST_TEST(wait_exit_code(pid) == 130);
      const auto a = read_json(tmp.path / "a.json");
      BOOST_TEST(a["status"].get<std::string>() == "interrupted");
      BOOST_TEST(a["ranks_identical"].get<bool>());  // both stopped after the same step
      BOOST_TEST(a["step"]["host_sync"].get<std::string>() == mode);
      stopped = a["steps"].get<int64_t>();
      BOOST_TEST(fs::exists(ckpt / ("step-" + std::to_string(stopped))));
      const auto rows = records(metrics);
      BOOST_REQUIRE_EQUAL(rows.size(), static_cast<size_t>(stopped));
      for (size_t k = 0; k < rows.size(); ++k) BOOST_TEST(rows[k]["step"].get<size_t>() == k);
      const Result r =
          run(launch + " --nproc-per-node 2 --master-port " + std::to_string(ampkit::test::free_port()) +
              " -- " + train + " " + mlp + " --progress never --threads 1 --batch-size 8 --steps " +
              std::to_string(stopped + 3) + " --host-sync " + mode + " --checkpoint-dir " + ckpt.string() +
              " --resume auto --summary " + (tmp.path / "b.json").string());
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      const auto b = read_json(tmp.path / "b.json");
      BOOST_TEST(b["steps"].get<int64_t>() == stopped + 3);
      BOOST_TEST(b["ranks_identical"].get<bool>());
      BOOST_TEST(r.output.find("[rank 1] ampkit-train: resumed from") != std::string::npos, r.output);
    }
  }
  // The 2-rank checkpoint in one process: the comm plugins declare their state empty (CommFact) and
  // the checkpoint holds none for gloo, so comm local (the default) resumes everything, as gloo does.
  const std::string one = train + " " + mlp + " --progress never --threads 1 --batch-size 8 --steps " +
                          std::to_string(stopped + 5) + " --resume " +
                          (ckpt / ("step-" + std::to_string(stopped))).string();
  const Result local = run(one);
  BOOST_TEST(local.code == 0, local.output);
  BOOST_TEST(local.output.find("resumed from") != std::string::npos, local.output);
  const Result gloo = run(one + " --comm gloo --master-port " + std::to_string(ampkit::test::free_port()));
  BOOST_TEST(gloo.code == 0, gloo.output);
  BOOST_TEST(gloo.output.find("resumed from") != std::string::npos, gloo.output);
}

BOOST_AUTO_TEST_CASE(config_file_distributed_options_rank_below_environment_and_command_line) {
  TempDir tmp;
  const fs::path yaml = tmp.path / "dist.yaml";
  std::ofstream(yaml) << "world-size: 4\nrank: 2\nmaster-port: 29123\nbucket-cap-mb: 50\n"
                         "find-unused-parameters: true\ndist-timeout: 60\n";
  const Result r =
      run("RANK=3 " + train + " --config " + yaml.string() + " --master-port 29200 --print-config");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string file = "config file " + yaml.string();
  BOOST_TEST(has_setting(r.output, "world-size", "4", file), r.output);
  BOOST_TEST(has_setting(r.output, "rank", "3", "environment (RANK)"));
  BOOST_TEST(has_setting(r.output, "master-port", "29200", "command line"));
  BOOST_TEST(has_setting(r.output, "bucket-cap-mb", "50", file));
  BOOST_TEST(has_setting(r.output, "find-unused-parameters", "true", file));
  BOOST_TEST(has_setting(r.output, "dist-timeout", "60", file));
  const Result bad = run(train + " " + tiny_args + " --bucket-cap-mb 0");
  BOOST_TEST(bad.code == 2);
  BOOST_TEST(bad.output.find("bucket-cap-mb must be in (0, 65536], got 0") != std::string::npos, bad.output);
}
