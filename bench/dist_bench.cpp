// Distributed benchmark: weak and strong scaling of ampkit-train on 1 and 2 ranks with
// comm gloo, memory per rank, and all-reduce bus bandwidth through the gloo plugin vs raw c10d
// Gloo in the same processes. Prints tables; docs/benchmarks.md records them.
#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "ampkit/comm_backend.h"
#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"

namespace fs = std::filesystem;

namespace {

struct Options {
  int steps = 60;
  int batch = 64;  // per rank in weak scaling; batch * 2 is the global batch in strong scaling
  int width = 512;
  std::vector<int> ranks = {1, 2};
  std::string comm = "gloo";
  std::string device = "cpu";
  int iterations = 20;  // all-reduce timings per message size (median)
};

struct RankResult {
  int code = -1;
  double max_rss_mib = 0;
};

// Runs `args` as `ranks` processes with torchrun's environment; exit codes and peak RSS per rank.
std::vector<RankResult> run_ranks(const std::vector<std::string>& args, int ranks, int port) {
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      if (std::FILE* f = std::fopen("/dev/null", "w")) ::dup2(::fileno(f), 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    int status = 0;
    struct rusage usage {};
    ::wait4(pids[static_cast<size_t>(r)], &status, 0, &usage);
    out[static_cast<size_t>(r)].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    out[static_cast<size_t>(r)].max_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  }
  return out;
}

int scaling(const fs::path& bin, const fs::path& work, const Options& o) {
  const int steps = o.steps, batch = o.batch, width = o.width;
  std::printf(
      "Scaling: ampkit-train --workload synthetic --synthetic-width %d --synthetic-depth 4, fp32, AdamW,\n"
      "%d steps, comm %s, device %s, --threads 1 per rank; samples/s of the job (all ranks), peak RSS per "
      "rank\n\n",
      width, steps, o.comm.c_str(), o.device.c_str());
  std::printf("%-8s %5s %14s %12s %12s %10s %16s\n", "mode", "ranks", "batch/rank", "global batch",
              "samples/s", "speed-up", "RSS/rank MiB");
  int port = 29900 + static_cast<int>(::getpid() % 50) * 2;
  double base = 0;
  for (const std::string mode : {"weak", "strong"}) {
    for (int ranks : o.ranks) {
      const int per_rank = mode == "weak" ? batch : std::max(1, batch * o.ranks.back() / ranks);
      const fs::path summary = work / (mode + std::to_string(ranks) + ".json");
      std::vector<std::string> args = {(bin / "ampkit-train").string(),
                                       "--workload",
                                       "synthetic",
                                       "--synthetic-width",
                                       std::to_string(width),
                                       "--synthetic-depth",
                                       "4",
                                       "--steps",
                                       std::to_string(steps),
                                       "--batch-size",
                                       std::to_string(per_rank),
                                       "--progress",
                                       "never",
                                       "--eval-batches",
                                       "1",
                                       "--comm",
                                       o.comm,
                                       "--device",
                                       o.device,
                                       "--threads",
                                       "1",
                                       "--summary",
                                       summary.string()};
      const auto results = run_ranks(args, ranks, port++);
      double rss = 0;
      for (const auto& r : results) {
        if (r.code != 0) {
          std::fprintf(stderr, "ampkit-bench-dist: a rank exited %d\n", r.code);
          return 1;
        }
        rss = std::max(rss, r.max_rss_mib);
      }
      std::ifstream in(summary);
      const double sps = nlohmann::json::parse(in)["samples_per_second"].get<double>();
      if (ranks == o.ranks.front()) base = sps;
      std::printf("%-8s %5d %14d %12d %12.0f %9.2fx %16.0f\n", mode.c_str(), ranks, per_rank,
                  per_rank * ranks, sps, sps / base, rss);
      std::fflush(stdout);
    }
  }
  return 0;
}

// One rank of the all-reduce benchmark: the plugin and a raw c10d Gloo group side by side.
int allreduce_worker(int rank, int world, int port, int iterations) {
  // One thread per rank, as ampkit-train picks with 2 ranks on 2 cores: OpenMP threads spinning
  // after the mean's division otherwise steal the cores from Gloo's I/O (measured: 15 ms per
  // 256 KiB all-reduce instead of 0.6 ms).
  at::set_num_threads(1);
  ampkit::Registry registry;
  const ampkit::LoadedPlugin& plugin = registry.load(registry.find("comm", "gloo"));
  ampkit::OptionInputs inputs;
  auto strategy = plugin.create(ampkit::resolve_options(plugin.descriptor(), inputs).values);
  auto* comm = dynamic_cast<ampkit::CommBackend*>(strategy.get());
  ampkit::DistributedConfig config;
  config.world_size = world;
  config.rank = rank;
  config.master_port = port;
  comm->init(config);

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port + 1);
  store_options.isServer = rank == 0;
  store_options.numWorkers = world;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto raw = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);

  if (rank == 0) {
    std::printf(
        "\nAll-reduce (sum, fp32), %d ranks on this machine, median of %d; busbw = algbw * 2(n-1)/n\n\n",
        world, iterations);
    std::printf("%12s %14s %14s %14s %14s %10s\n", "bytes", "plugin us", "plugin GB/s", "raw c10d us",
                "raw GB/s", "plugin/raw");
  }
  auto median_us = [&](const std::function<void()>& op) {
    std::vector<double> t;
    op();  // warm-up
    for (int i = 0; i < iterations; ++i) {
      comm->barrier();
      const auto start = std::chrono::steady_clock::now();
      op();
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double factor = 2.0 * (world - 1) / world;
  for (int64_t bytes = 4096; bytes <= 64LL << 20; bytes *= 4) {
    std::vector<at::Tensor> a = {at::ones({bytes / 4})};
    std::vector<at::Tensor> b = {at::ones({bytes / 4})};
    const double plugin_us = median_us([&] { comm->all_reduce_mean(a); });
    const double raw_us = median_us([&] {
      c10d::AllreduceOptions o;
      raw->allreduce(b, o)->wait();
    });
    if (rank == 0)
      std::printf("%12lld %14.1f %14.3f %14.1f %14.3f %9.2fx\n", static_cast<long long>(bytes), plugin_us,
                  bytes / plugin_us / 1e3 * factor, raw_us, bytes / raw_us / 1e3 * factor,
                  plugin_us / raw_us);
    std::fflush(stdout);
  }
  comm->barrier();
  return 0;
}

// --name VALUE pairs; the first bad one is one line on stderr and exit 2.
bool parse_options(int argc, char** argv, Options& o) {
  const auto int_of = [](const std::string& name, const char* text, int low, int& out) {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < low || v > 1000000) {
      std::fprintf(stderr, "ampkit-bench-dist: %s must be an integer >= %d, got '%s'\n", name.c_str(), low,
                   text);
      return false;
    }
    out = static_cast<int>(v);
    return true;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ampkit-bench-dist: %s needs a value (see --help)\n", name.c_str());
      return false;
    }
    const char* value = argv[i + 1];
    bool ok = true;
    if (name == "--steps")
      ok = int_of(name, value, 1, o.steps);
    else if (name == "--batch-size")
      ok = int_of(name, value, 1, o.batch);
    else if (name == "--width")
      ok = int_of(name, value, 1, o.width);
    else if (name == "--iterations")
      ok = int_of(name, value, 1, o.iterations);
    else if (name == "--comm")
      o.comm = value;
    else if (name == "--device")
      o.device = value;
    else if (name == "--ranks") {
      o.ranks.clear();
      std::string list = value;
      for (size_t at = 0; ok && at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        int r = 0;
        ok = int_of("--ranks", list.substr(at, comma - at).c_str(), 1, r);
        if (ok && !o.ranks.empty() && r <= o.ranks.back()) {
          std::fprintf(stderr, "ampkit-bench-dist: --ranks must be increasing, got '%s'\n", value);
          ok = false;
        }
        o.ranks.push_back(r);
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "ampkit-bench-dist: unknown option '%s' (see --help)\n", name.c_str());
      ok = false;
    }
    if (!ok) return false;
  }
  return true;
}

int all_reduce_table(const fs::path& self, const Options& o) {
  int rc = 0;
  const int port = 29800 + static_cast<int>(::getpid() % 50) * 2;
  const int world = std::max(2, o.ranks.back());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<std::string> a = {self.string(),        "--allreduce-worker",
                                    std::to_string(r),    std::to_string(world),
                                    std::to_string(port), std::to_string(o.iterations)};
      std::vector<char*> argv2;
      for (auto& s : a) argv2.push_back(s.data());
      argv2.push_back(nullptr);
      ::execv(argv2[0], argv2.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--allreduce-worker")
    return allreduce_worker(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::printf(
        "usage: ampkit-bench-dist [--steps 60] [--batch-size 64] [--width 512] [--ranks 1,2] [--comm gloo]\n"
        "                         [--device cpu] [--iterations 20]\n"
        "Weak scaling (--batch-size per rank) and strong scaling (global batch: --batch-size x the largest\n"
        "rank count) of ampkit-train --workload synthetic on each rank count of --ranks, then the\n"
        "all-reduce bandwidth of the gloo plugin against raw c10d Gloo on max(2, largest) ranks.\n"
        "bench/scaling.py repeats it, takes medians, writes CSV; plot_scaling.py plots them.\n");
    return 0;
  }
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  const fs::path self = fs::canonical("/proc/self/exe");
  char tmpl[] = "/tmp/ampkit-bench-dist-XXXXXX";
  const fs::path work = ::mkdtemp(tmpl);
  int rc = scaling(self.parent_path(), work, o);
  if (rc == 0) rc = all_reduce_table(self, o);
  fs::remove_all(work);
  return rc;
}
