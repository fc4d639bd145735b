// What one healthy data-parallel step costs besides the Reducer's gradient buckets: no
// collective (every rank's loss and the host's values ride in the buckets, StepValuesCarrier) and
// exactly one counted device-to-host read, on the CPU fast path and on the device statistics
// path, with and without accumulation; none with the deferred step, whose records are
// the synchronous step's. The process group's own collectives are counted too: the
// buckets' all-reduce and nothing else. Two or three ranks with comm gloo, each a forked process
// running a Trainer in-process behind a comm that counts every call.
#define BOOST_TEST_MODULE step_collectives
#include <ATen/record_function.h>
#include <ampkit/comm_backend.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ampkit/fused_adamw.h"
#include "ampkit/grad_stats.h"
#include "ampkit/host_reads.h"
#include "cuda_division.h"
#include "free_port.h"
#include "trainer_fixture.h"

using namespace ampkit;
using namespace ampkit::test;

namespace {

// Forwards to the gloo backend and counts each collective the engine asks of it. The Reducer's
// buckets go to the process group directly, so they are not counted here.
class CountingComm final : public CommBackend {
 public:
  explicit CountingComm(CommBackend& inner) : inner_(inner) {}
  void init(const DistributedConfig& config) override { inner_.init(config); }
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  void all_reduce_mean(std::vector<at::Tensor>& t) override {
    ++calls["all_reduce_mean"];
    inner_.all_reduce_mean(t);
  }
  void broadcast(std::vector<at::Tensor>& t, int root) override {
    ++calls["broadcast"];
    inner_.broadcast(t, root);
  }
  at::Tensor all_gather(const at::Tensor& t) override {
    ++calls["all_gather"];
    return inner_.all_gather(t);
  }
  void barrier() override {
    ++calls["barrier"];
    inner_.barrier();
  }
  c10d::ProcessGroup* process_group() override { return inner_.process_group(); }
  int total() const {
    int n = 0;
    for (const auto& [name, count] : calls) n += count;
    return n;
  }
  std::map<std::string, int> calls;

 private:
  CommBackend& inner_;
};

// Every collective the process group runs, the Reducer's buckets included: c10d records each
// as a user-scope RecordFunction named by its backend and kind ("gloo:all_reduce").
std::atomic<int> g_group_collectives{0};
std::vector<std::string> g_group_collective_names;
std::mutex g_names_mutex;

std::unique_ptr<at::ObserverContext> collective_started(const at::RecordFunction& fn) {
  const std::string name = fn.name();
  if (name.rfind("gloo:", 0) == 0) {
    ++g_group_collectives;
    std::lock_guard<std::mutex> lock(g_names_mutex);
    g_group_collective_names.push_back(name);
  }
  return nullptr;
}

struct Case {
  std::string name;
  int accumulate;
  bool device_path;
  DataParallelOptions options = {};
  int group_collectives = 1;  // the buckets' all-reduce (TinyModel fits in one bucket)
};

// This rank joins the gloo group of `world` ranks at `port` on this machine.
void join_gloo(CommBackend& comm, int rank, int port, int world = 2) {
  DistributedConfig d;
  d.world_size = world;
  d.rank = rank;
  d.backend = "gloo";
  d.master_port = port;
  d.timeout_seconds = 60;
  comm.init(d);
}

// One rank's run: two first steps (the Reducer builds its buckets), then 4 counted steps. Writes, per
// counted step, the collectives and reads it made, its loss and both ranks' values, to `out`.
void run_rank(int rank, int port, const Case& c, const std::string& out) {
  at::set_num_threads(1);
  // Divisions by plain numbers round as on CUDA: the mean over 3 micro-batches must still be the
  // host's sum / 3, which the checks below recompute.
  const test::CudaDivision cuda_rounding;
  BuiltinPlugins plugins;
  auto set = plugins.strategies({{"comm", BuiltinPlugins::choice("gloo")}});
  join_gloo(set->comm(), rank, port);
  CountingComm comm(set->comm());
  at::manual_seed(7);  // the same initial model on both ranks
  TinyModel model;
  torch::optim::SGD sgd(model.params(), torch::optim::SGDOptions(0.1));
  Trainer trainer(Precision::fp32, c.accumulate, model.params(), model.names(), sgd,
                  {&set->scaler(), &set->clipper(), &set->nan_policy(), &comm}, constant_lr(0.1));
  if (c.device_path) trainer.set_stats_recipe(DeviceStatsRecipe::foreach_ops);
  trainer.enable_data_parallel(c.options);
  trainer.set_rank_values([rank] { return std::vector<double>{10.0 + rank, 20.0 + rank}; });
  double local_loss = 0;  // this rank's loss of the step, summed as the Trainer sums it
  auto forward = [&](int64_t step) {
    return [&model, &local_loss, step, rank, &c](int micro) {
      const at::Tensor loss = model.loss(batch_x(step * 10 + micro * 2 + rank)) * (1.0 + rank);
      local_loss = (micro == 0 ? 0.0 : local_loss) + loss.item<float>();
      return loss;
    };
  };
  trainer.step(forward(0));  // records the order gradients arrive in
  trainer.step(forward(1));  // the Reducer rebuilds its buckets in that order (two broadcasts)
  at::addGlobalCallback(at::RecordFunctionCallback(collective_started).scopes({at::RecordScope::USER_SCOPE}));
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t step = 2; step <= 5; ++step) {
    comm.calls.clear();
    g_group_collectives = 0;
    g_group_collective_names.clear();
    const int64_t reads = host_reads();
    const StepOutcome o = trainer.step(forward(step));
    const int64_t step_reads = host_reads() - reads;  // before the test's own reads below
    steps.push_back({{"collectives", comm.total()},
                     {"group_collectives", g_group_collectives.load()},
                     {"group_collective_names", g_group_collective_names},
                     {"all_gather", comm.calls["all_gather"]},
                     {"reads", step_reads},
                     {"local_loss", local_loss / c.accumulate},
                     {"stepped", o.stepped},
                     {"loss", o.stats.loss},
                     {"rank_values", o.rank_values},
                     {"weight0", model.layer->weight.view({-1})[0].item<double>()}});
  }
  std::ofstream(out) << steps.dump();
}

// Both steps, synchronous and deferred, on `world` ranks: FusedAdamW, fp16, the dynamic scaler, a clipper
// that clips and the backoff policy; rank 1's loss is infinite at step 5 and NaN at step 8. Per step from
// step 2 (the Reducer's buckets are built): its collectives and reads, then every outcome (the
// deferred step's arrive one step late), this rank's own losses and the final weights.
nlohmann::json fused_rank(int rank, int port, bool deferred, int world = 2) {
  at::set_num_threads(1);
  BuiltinPlugins plugins;
  auto set = plugins.strategies(
      {{"comm", BuiltinPlugins::choice("gloo")},
       {"scaler", BuiltinPlugins::choice("dynamic", {{"init_scale", "1024"}, {"growth_interval", "3"}})},
       {"clipper", BuiltinPlugins::choice("norm", {{"max_norm", "0.05"}})},
       {"nan_policy", BuiltinPlugins::choice("backoff", {})}});
  join_gloo(set->comm(), rank, port, world);
  CountingComm comm(set->comm());
  at::manual_seed(7);
  TinyModel model;
  FusedAdamW adamw(model.params(), torch::optim::AdamWOptions(1e-2));
  Trainer trainer(Precision::fp16, 1, model.params(), model.names(), adamw,
                  {&set->scaler(), &set->clipper(), &set->nan_policy(), &comm}, constant_lr(1e-2));
  trainer.enable_data_parallel({});
  std::string kind;
  if (deferred) {
    const std::string why = trainer.enable_deferred_step(kind, false);
    if (!why.empty()) throw std::runtime_error("no deferred step: " + why);
  }
  trainer.set_rank_values([rank] { return std::vector<double>{10.0 + rank, 20.0 + rank}; });
  at::addGlobalCallback(at::RecordFunctionCallback(collective_started).scopes({at::RecordScope::USER_SCOPE}));
  nlohmann::json out = {{"steps", nlohmann::json::array()}, {"outcomes", nlohmann::json::array()}};
  std::vector<double> local;
  const auto record = [&out](const StepOutcome& o) {
    out["outcomes"].push_back({{"step", o.stats.step},
                               {"stepped", o.stepped},
                               {"loss", o.stats.loss},
                               {"scale", o.stats.scale},
                               {"scale_next", o.scale_next},
                               {"clip", o.clip_coefficient},
                               {"grad_norm", o.stats.grad_norm},
                               {"rank_values", o.rank_values}});
  };
  for (int64_t step = 0; step < 12; ++step) {
    const auto forward = [&model, &local, step, rank](int) {
      at::Tensor loss = model.loss(batch_x(step * 2 + rank));
      local.push_back(loss.item<double>());  // before the planted faults: the mean stays finite
      if (rank == 1 && step == 5) loss = loss * std::numeric_limits<float>::infinity();
      if (rank == 1 && step == 8) loss = loss * std::nan("");
      return loss;
    };
    comm.calls.clear();
    g_group_collectives = 0;
    const int64_t reads = host_reads();
    if (deferred) {
      for (const StepOutcome& o : trainer.deferred_backward(forward).delivered) record(o);
      trainer.deferred_update();
    } else {
      record(trainer.step(forward));
    }
    if (step >= 2)
      out["steps"].push_back({{"reads", host_reads() - reads},
                              {"collectives", comm.total()},
                              {"group_collectives", g_group_collectives.load()}});
  }
  for (const StepOutcome& o : trainer.settle()) record(o);
  out["local_loss"] = local;
  out["weights"] = std::vector<double>(model.layer->weight.data_ptr<float>(),
                                       model.layer->weight.data_ptr<float>() + model.layer->weight.numel());
  return out;
}

// `rank_main(rank, port, out)` in `world` forked processes; what each wrote to `out`, rank by rank.
template <typename RankMain>
nlohmann::json fork_ranks(int world, RankMain rank_main) {
  const int port = ampkit::test::free_port();
  const auto file = [](pid_t parent, int rank) {
    return "/tmp/ampkit-step-collectives-" + std::to_string(parent) + "-" + std::to_string(rank) + ".json";
  };
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        rank_main(rank, port, file(::getppid(), rank));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (int rank = 0; rank < world; ++rank) {
    int status = 0;
    ::waitpid(pids[static_cast<size_t>(rank)], &status, 0);
    BOOST_REQUIRE_MESSAGE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank " << rank << " failed");
    std::ifstream in(file(::getpid(), rank));
    ranks.push_back(nlohmann::json::parse(in));
    std::remove(file(::getpid(), rank).c_str());
  }
  return ranks;
}

template <typename RankMain>
nlohmann::json fork_two_ranks(RankMain rank_main) {
  return fork_ranks(2, rank_main);
}

nlohmann::json run_two_ranks(const Case& c) {
  return fork_two_ranks([&c](int rank, int port, const std::string& out) { run_rank(rank, port, c, out); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_healthy_step_makes_no_collective_besides_the_buckets_and_one_host_read) {
  DataParallelOptions bucket_view, find_unused;
  bucket_view.gradient_as_bucket_view = true;
  find_unused.find_unused_parameters = true;
  for (const Case& c : {Case{"cpu fast path", 1, false}, Case{"cpu fast path, accumulate 3", 3, false},
                        Case{"device path", 1, true}, Case{"device path, accumulate 3", 3, true},
                        Case{"gradients as bucket views", 1, false, bucket_view},
                        // DDP's own extra all-reduce of which parameters were used, as torch's:
                        Case{"find unused parameters, accumulate 3", 3, true, find_unused, 2}}) {
    const nlohmann::json ranks = run_two_ranks(c);
    for (size_t step = 0; step < 4; ++step)
      for (int rank = 0; rank < 2; ++rank) {
        const auto& s = ranks[rank][step];
        BOOST_TEST_CONTEXT(c.name << ", counted step " << step + 1 << ", rank " << rank) {
          BOOST_TEST(s["stepped"].get<bool>());
          BOOST_TEST(s["collectives"].get<int>() == 0);  // besides the Reducer's buckets
          BOOST_TEST(s["all_gather"].get<int>() == 0);
          BOOST_TEST(s["group_collectives"].get<int>() == c.group_collectives,
                     s["group_collective_names"].dump());
          BOOST_TEST(s["reads"].get<int64_t>() == 1);
          // Both ranks' values, in rank order, on both ranks; the same mean loss and weights.
          BOOST_TEST(s["rank_values"].get<std::vector<double>>() == (std::vector<double>{10, 20, 11, 21}),
                     boost::test_tools::per_element());
          BOOST_TEST(s["loss"].get<double>() == ranks[0][step]["loss"].get<double>());
          // The mean of both ranks' own losses, exactly: the values arrived bit for bit.
          BOOST_TEST(
              s["loss"].get<double>() ==
              (ranks[0][step]["local_loss"].get<double>() + ranks[1][step]["local_loss"].get<double>()) / 2);
          BOOST_TEST(ranks[1][step]["local_loss"].get<double>() !=
                     ranks[0][step]["local_loss"].get<double>());
          BOOST_TEST(s["weight0"].get<double>() == ranks[0][step]["weight0"].get<double>());
        }
      }
  }
}

// Two ranks: the deferred step makes no collective besides the buckets and no host read
// per step (the synchronous one: one), and delivers, one step late, every outcome the synchronous
// step gives: both ranks' values, their mean loss bit for bit, both planted faults skipped by both
// ranks; the weights end bit for bit the same.
BOOST_AUTO_TEST_CASE(the_deferred_step_on_two_ranks_reads_nothing_and_gives_the_synchronous_outcomes) {
  const nlohmann::json sync = fork_two_ranks([](int rank, int port, const std::string& out) {
    std::ofstream(out) << fused_rank(rank, port, false).dump();
  });
  const nlohmann::json deferred = fork_two_ranks([](int rank, int port, const std::string& out) {
    std::ofstream(out) << fused_rank(rank, port, true).dump();
  });
  for (int rank = 0; rank < 2; ++rank) {
    BOOST_TEST_CONTEXT("rank " << rank) {
      const nlohmann::json &a = sync[rank], &b = deferred[rank];
      for (size_t i = 0; i < a["steps"].size(); ++i) {
        BOOST_TEST(a["steps"][i]["reads"].get<int64_t>() == 1, "step " << i + 2);
        BOOST_TEST(b["steps"][i]["reads"].get<int64_t>() == 0, "step " << i + 2);
        BOOST_TEST(b["steps"][i]["collectives"].get<int>() == 0);
        BOOST_TEST(b["steps"][i]["group_collectives"].get<int>() == 1);  // the buckets' all-reduce
      }
      BOOST_REQUIRE_EQUAL(a["outcomes"].size(), 12u);
      BOOST_REQUIRE_EQUAL(b["outcomes"].size(), 12u);
      int skipped = 0, clipped = 0;
      for (size_t i = 0; i < 12; ++i) {
        BOOST_TEST(a["outcomes"][i] == b["outcomes"][i], "step " << i << ":\n"
                                                                 << a["outcomes"][i].dump() << "\n"
                                                                 << b["outcomes"][i].dump());
        BOOST_TEST(b["outcomes"][i]["rank_values"].get<std::vector<double>>() ==
                       (std::vector<double>{10, 20, 11, 21}),
                   boost::test_tools::per_element());
        skipped += !b["outcomes"][i]["stepped"].get<bool>();
        clipped += b["outcomes"][i]["clip"].get<double>() < 1.0;
        if (i != 5 && i != 8)  // the mean of both ranks' own losses, exactly
          BOOST_TEST(
              b["outcomes"][i]["loss"].get<double>() ==
              (deferred[0]["local_loss"][i].get<double>() + deferred[1]["local_loss"][i].get<double>()) / 2);
      }
      BOOST_TEST(!b["outcomes"][5]["stepped"].get<bool>());
      BOOST_TEST(!b["outcomes"][8]["stepped"].get<bool>());
      BOOST_TEST(skipped == 2);
      BOOST_TEST(clipped > 5);
      BOOST_TEST(a["weights"] == b["weights"]);
      BOOST_TEST(b["weights"] == deferred[0]["weights"]);
    }
  }
}

// Three ranks, as on a GPU: every division of a tensor by a plain number rounds as CUDA's kernel
// does (x * (1/3), cuda_division.h). The deferred step's mean loss, decoded on the device, is
// compared by bits with the host's sum / 3 when its record arrives; for losses whose sum s has
// s * (1/3) != s / 3 a plain-number division there stopped the run with an internal error. The
// deferred outcomes are the synchronous ones, and every mean loss is the host's sum / 3.
BOOST_AUTO_TEST_CASE(the_deferred_step_on_three_ranks_with_cudas_division_gives_the_synchronous_outcomes) {
  const auto run = [](bool deferred) {
    return fork_ranks(3, [deferred](int rank, int port, const std::string& out) {
      const test::CudaDivision cuda_rounding;
      std::ofstream(out) << fused_rank(rank, port, deferred, 3).dump();
    });
  };
  const nlohmann::json sync = run(false), deferred = run(true);
  int rounding_differs = 0;
  for (size_t i = 0; i < 12; ++i) {
    if (i == 5 || i == 8) continue;  // the planted faults
    double sum = 0.0;
    for (int r = 0; r < 3; ++r) sum += deferred[r]["local_loss"][i].get<double>();
    rounding_differs += sum * (1.0 / 3) != sum / 3;
    for (int r = 0; r < 3; ++r)
      BOOST_TEST(deferred[r]["outcomes"][i]["loss"].get<double>() == sum / 3, "rank " << r << ", step " << i);
  }
  BOOST_TEST(rounding_differs > 0);  // the losses tell the two divisions apart
  for (int rank = 0; rank < 3; ++rank) {
    BOOST_TEST_CONTEXT("rank " << rank) {
      const nlohmann::json &a = sync[rank], &b = deferred[rank];
      BOOST_REQUIRE_EQUAL(b["outcomes"].size(), 12u);
      for (size_t i = 0; i < 12; ++i)
        BOOST_TEST(a["outcomes"][i] == b["outcomes"][i], "step " << i << ":\n"
                                                                 << a["outcomes"][i].dump() << "\n"
                                                                 << b["outcomes"][i].dump());
      BOOST_TEST(b["outcomes"][11]["rank_values"].get<std::vector<double>>() ==
                     (std::vector<double>{10, 20, 11, 21, 12, 22}),
                 boost::test_tools::per_element());
      BOOST_TEST(!b["outcomes"][5]["stepped"].get<bool>());
      BOOST_TEST(!b["outcomes"][8]["stepped"].get<bool>());
      BOOST_TEST(a["weights"] == b["weights"]);
    }
  }
}
