// Data-parallel training across processes with comm gloo: parity with one rank, identical NaN
// decisions, lost ranks, the launcher, and the checks on the job layout. Cases labelled "slow"
// are disabled by default and run by the ctest test test_distributed_slow (--run_test=@slow).
#define BOOST_TEST_MODULE distributed
#include <array>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <thread>

#include "train_process.h"

using namespace ampkit::test;

namespace {

const std::string launch = std::string(AMPKIT_TEST_BIN_DIR) + "/ampkit-launch";

// A port per call, spread by process id so parallel test programs rarely meet.
int next_port() {
  static int n = 0;
  return 20000 + static_cast<int>(::getpid() % 2000) * 10 + (n++ % 10);
}

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
  const Result b = run(launch + " --nproc-per-node 2 --master-port " + std::to_string(next_port()) + " -- " +
                       train + " " + common + " --batch-size " + std::to_string(batch) + " --metrics " +
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
  const Result r =
      run(launch + " --nproc-per-node 2 --master-port " + std::to_string(next_port()) + " -- " + train + " " +
          mlp + " --progress never --threads 1 --steps 12 --batch-size 16 --inject nan@step=5,rank=1" +
          " --nan-report-dir " + tmp.path.string() + " --metrics " + metrics.string() + " --summary " +
          summary.string());
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
}

namespace {

struct Survivor {
  int code = -1;
  double seconds = 0;
  std::string log;
};

// Starts ranks 0 and 1 directly (no launcher), each with its own arguments after the common ones.
std::vector<pid_t> spawn_two_ranks(const std::string& common, const std::array<std::string, 2>& own,
                                   const TempDir& tmp) {
  const int port = next_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<std::string> args = {train};
    for (const auto& w : words(common + " " + own[static_cast<size_t>(r)])) args.push_back(w);
    pids.push_back(spawn(args, tmp.path / ("rank" + std::to_string(r) + ".log")));
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  return pids;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Does `hurt` to rank 1 once rank 0 trains, times rank 0's exit.
Survivor lose_rank_one(int signal_number, int timeout_seconds) {
  TempDir tmp;
  const fs::path metrics = tmp.path / "m.jsonl";
  const std::vector<pid_t> pids =
      spawn_two_ranks(mlp + " --progress never --threads 1 --steps 1000000 --batch-size 8 --dist-timeout " +
                          std::to_string(timeout_seconds) + " --metrics " + metrics.string(),
                      {"", ""}, tmp);
  for (int i = 0; i < 300 && count_lines(metrics) < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  BOOST_REQUIRE(count_lines(metrics) >= 5);
  ::kill(pids[1], signal_number);
  const auto start = std::chrono::steady_clock::now();
  Survivor s;
  s.code = wait_exit_code(pids[0]);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(pids[1], SIGKILL);
  wait_exit_code(pids[1]);
  s.log = read_text(tmp.path / "rank0.log");
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(killed_rank_makes_the_survivor_exit_7_naming_it) {
  const Survivor s = lose_rank_one(SIGKILL, 10);
  BOOST_TEST_MESSAGE("rank 1 killed: rank 0 exited " << s.code << " after " << s.seconds << " s");
  BOOST_TEST(s.code == 7, s.log);
  BOOST_TEST(s.seconds < 10 + 10);
  BOOST_TEST(s.log.find("ampkit-train: error: rank 0: lost rank 1") != std::string::npos, s.log);
}

BOOST_AUTO_TEST_CASE(hung_rank_makes_the_survivor_exit_7_within_the_timeout) {
  const Survivor s = lose_rank_one(SIGSTOP, 4);
  BOOST_TEST_MESSAGE("rank 1 stopped: rank 0 exited " << s.code << " after " << s.seconds << " s");
  BOOST_TEST(s.code == 7, s.log);
  BOOST_TEST(s.seconds >= 4 - 0.5);  // it waited for the collective's timeout, not less
  BOOST_TEST(s.seconds < 4 + 10);
  BOOST_TEST(s.log.find("lost rank 1") != std::string::npos, s.log);
}

namespace {

// Both ranks' exit codes and logs, for ranks started with different arguments.
struct Pair {
  int code[2] = {-1, -1};
  std::string log[2];
};

Pair two_ranks(const std::string& common, const std::array<std::string, 2>& own) {
  TempDir tmp;
  const std::vector<pid_t> pids = spawn_two_ranks(common, own, tmp);
  Pair p;
  for (int r = 0; r < 2; ++r) {
    p.code[r] = wait_exit_code(pids[static_cast<size_t>(r)]);
    p.log[r] = read_text(tmp.path / ("rank" + std::to_string(r) + ".log"));
  }
  return p;
}

}  // namespace

// Ranks started with different settings are refused at start, on every rank, naming them: a
// different --precision passed unnoticed, a different scale was caught only at the first step's
// agreement, a different --lr or --steps not at all (issue 18).
BOOST_AUTO_TEST_CASE(ranks_started_with_different_settings_exit_2_before_training) {
  const std::string common = mlp + " --progress never --threads 1 --batch-size 8 --dist-timeout 20";
  const std::vector<std::pair<std::array<std::string, 2>, std::string>> cases = {
      {{"--steps 3 --precision fp32", "--steps 3 --precision bf16"}, "--precision"},
      {{"--steps 3 --scaler static --opt scaler.scale=256", "--steps 3 --scaler static --opt scaler.scale=1024"},
       "scaler.scale"},
      {{"--steps 3 --lr 0.001", "--steps 4 --lr 0.002"}, "--steps, --lr"},
  };
  for (const auto& [own, names] : cases) {
    const Pair p = two_ranks(common, own);
    for (int r = 0; r < 2; ++r) {
      BOOST_TEST(p.code[r] == 2, "rank " << r << ":\n" << p.log[r]);
      BOOST_TEST(p.log[r].find("ampkit-train: error: the ranks were started with different settings: " + names +
                               " (this rank, " + std::to_string(r) + ": ") != std::string::npos,
                 p.log[r]);
    }
  }
}

BOOST_AUTO_TEST_CASE(launcher_prefixes_ranks_and_stops_all_when_one_fails) {
  const Result r = run(launch + " --nproc-per-node 2 --master-port " + std::to_string(next_port()) + " -- " +
                       train + " " + mlp + " --steps 2 --inject nan@step=0,rank=7");
  BOOST_TEST(r.code == 2, r.output);
  // Both ranks reject the spec before the rendezvous; whichever exits first, the launcher names it.
  BOOST_TEST(r.output.find("] ampkit-train: error: --inject 'nan@step=0,rank=7': rank 7 does not exist") !=
                 std::string::npos,
             r.output);
  BOOST_TEST(r.output.find("exited with code 2; stopping the other ranks") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("SIGKILL") == std::string::npos, r.output);  // nobody was left waiting
  BOOST_TEST(r.output.find("ampkit-launch: rank ") != std::string::npos, r.output);
  const Result none = run(launch + " --nproc-per-node 2");
  BOOST_TEST(none.code == 2);
  BOOST_TEST(none.output.find("ampkit-launch: error: no program given") != std::string::npos, none.output);
  // A program that cannot be started is exit 7, as documented (it was the shell's 127).
  const Result missing = run(launch + " --nproc-per-node 2 -- /nonexistent/prog");
  BOOST_TEST(missing.code == 7, missing.output);
  BOOST_TEST(missing.output.find("ampkit-launch: error: cannot run /nonexistent/prog: No such file or directory") !=
                 std::string::npos,
             missing.output);
}

BOOST_AUTO_TEST_CASE(bad_job_layouts_get_one_line_and_exit_2) {
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
  };
  for (const auto& [command, message] : cases) {
    const Result r = run(command);
    BOOST_TEST(r.code == 2, command << "\n" << r.output);
    BOOST_TEST(r.output.find("ampkit-train: error: " + message) != std::string::npos, r.output);
  }
  if (!fs::exists("/dev/nvidia0")) {
    const Result r = run(train + " " + tiny_args + " --comm nccl");
    BOOST_TEST(r.code == 2, r.output);
    BOOST_TEST(r.output.find("comm 'nccl' needs CUDA") != std::string::npos, r.output);
  }
}

BOOST_AUTO_TEST_CASE(rendezvous_nobody_joins_exits_7) {
  const auto start = std::chrono::steady_clock::now();
  const Result r = run("RANK=1 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(next_port()) + " " + train + " " +
                       tiny_args + " --steps 1 --dist-timeout 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(r.code == 7, r.output);
  BOOST_TEST(r.output.find("ampkit-train: error: comm 'gloo': rendezvous at 127.0.0.1:") != std::string::npos,
             r.output);
  BOOST_TEST(seconds < 2 + 10);
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

BOOST_AUTO_TEST_CASE(sigterm_to_the_launcher_stops_all_ranks_after_one_step_and_resumes) {
  TempDir tmp;
  const fs::path ckpt = tmp.path / "ckpt", metrics = tmp.path / "m.jsonl";
  const std::string port = std::to_string(next_port());
  std::vector<std::string> args = {launch, "--nproc-per-node", "2", "--master-port", port, "--", train};
  for (const auto& w : words(
           mlp + " --progress never --threads 1 --batch-size 8 --steps 1000000 --checkpoint-dir " +
           ckpt.string() + " --metrics " + metrics.string() + " --summary " + (tmp.path / "a.json").string()))
    args.push_back(w);
  const pid_t pid = spawn(args, tmp.path / "launch.log");
  for (int i = 0; i < 300 && count_lines(metrics) < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, SIGTERM);
  BOOST_TEST(wait_exit_code(pid) == 130);
  const auto a = read_json(tmp.path / "a.json");
  BOOST_TEST(a["status"].get<std::string>() == "interrupted");
  BOOST_TEST(a["ranks_identical"].get<bool>());  // both stopped after the same step
  const int64_t stopped = a["steps"].get<int64_t>();
  BOOST_TEST(fs::exists(ckpt / ("step-" + std::to_string(stopped))));
  const Result r = run(launch + " --nproc-per-node 2 --master-port " + std::to_string(next_port()) + " -- " +
                       train + " " + mlp + " --progress never --threads 1 --batch-size 8 --steps " +
                       std::to_string(stopped + 3) + " --checkpoint-dir " + ckpt.string() +
                       " --resume auto --summary " + (tmp.path / "b.json").string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto b = read_json(tmp.path / "b.json");
  BOOST_TEST(b["steps"].get<int64_t>() == stopped + 3);
  BOOST_TEST(b["ranks_identical"].get<bool>());
  BOOST_TEST(r.output.find("[rank 1] ampkit-train: resumed from") != std::string::npos, r.output);
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
