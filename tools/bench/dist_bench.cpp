// Distributed benchmark (issue 6): weak and strong scaling of ampkit-train on 1 and 2 ranks with
// comm gloo, memory per rank, and all-reduce bus bandwidth through the gloo plugin vs raw c10d
// Gloo in the same processes. Prints tables; docs/benchmarks.md records them.
#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"

namespace fs = std::filesystem;

namespace {

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

int scaling(const fs::path& bin, const fs::path& work, int steps, int batch, int width) {
  std::printf(
      "Scaling: ampkit-train --workload synthetic --synthetic-width %d --synthetic-depth 4, fp32, AdamW,\n"
      "%d steps, comm gloo, --threads 1 per rank; samples/s of the job (all ranks), peak RSS per rank\n\n",
      width, steps);
  std::printf("%-8s %5s %14s %12s %12s %10s %16s\n", "mode", "ranks", "batch/rank", "global batch",
              "samples/s", "speed-up", "RSS/rank MiB");
  int port = 29900 + static_cast<int>(::getpid() % 50) * 2;
  double base = 0;
  for (const std::string mode : {"weak", "strong"}) {
    for (int ranks : {1, 2}) {
      const int per_rank = mode == "weak" ? batch : batch * 2 / ranks;
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
                                       "gloo",
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
      if (ranks == 1) base = sps;
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

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--allreduce-worker")
    return allreduce_worker(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::printf(
        "usage: ampkit-bench-dist [STEPS [BATCH [WIDTH]]]\n"
        "Weak/strong scaling of ampkit-train on 1 and 2 gloo ranks (defaults 60 steps, batch 64 per rank,\n"
        "width 512) and all-reduce bandwidth through the gloo plugin vs raw c10d Gloo.\n");
    return 0;
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 60;
  const int batch = argc > 2 ? std::atoi(argv[2]) : 64;
  const int width = argc > 3 ? std::atoi(argv[3]) : 512;
  const fs::path self = fs::canonical("/proc/self/exe");
  const fs::path bin = self.parent_path();
  char tmpl[] = "/tmp/ampkit-bench-dist-XXXXXX";
  const fs::path work = ::mkdtemp(tmpl);
  int rc = scaling(bin, work, steps, batch, width);
  if (rc == 0) {
    const int port = 29800 + static_cast<int>(::getpid() % 50) * 2;
    const std::vector<std::string> args = {self.string(), "--allreduce-worker", "R",
                                           "2",           std::to_string(port), "20"};
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        std::vector<std::string> a = args;
        a[2] = std::to_string(r);
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
  }
  fs::remove_all(work);
  return rc;
}
