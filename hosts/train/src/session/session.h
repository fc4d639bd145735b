// ampkit-train's run, split along its seams (docs/architecture.md, "Layout"): the session owns
// what a run is made of; checkpoints.h, nan_reports.h, rank_sync.h, stop_signals.h,
// precision_checks.h and pytorch_files.h each do one job for it, run_summary.h ends it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/fault_injection.h"
#include "ampkit/metrics.h"
#include "ampkit/registry.h"
#include "ampkit/strategy_set.h"
#include "ampkit/tensorboard.h"
#include "ampkit/trainer.h"
#include "config/train_config.h"
#include "session/host_state.h"
#include "session/run_summary.h"
#include "workloads/fp8_linear.h"
#include "workloads/workload.h"

namespace ampkit::train {

class CheckpointKeeper;
class RollbackKeeper;
class NanReporter;

// A Session's objects, by reference, for the helpers that save, restore and inspect them
// (resume, checkpoints, rollback, --init-from, NaN reports): the model, its trainable parameters,
// the optimizer, the trainer, the strategies and the host's own checkpointed state.
struct SessionObjects {
  const TrainConfig& cfg;
  ModelView& model;
  const std::vector<at::Tensor>& params;
  torch::optim::Optimizer& optimizer;
  Trainer& trainer;
  StrategySet& strategies;
  HostState& state;
  Fp8Linears* fp8 = nullptr;  // the workload's fp8 layers under --fp8
};

// ampkit-train's help (the host's options, and those of each plugin named on the command line).
int print_help(const TrainConfig& cfg);
// --print-config: every effective setting with its source, and each plugin's options.
void print_config(const TrainConfig& cfg, const StrategySet& strategies);
// The registry ampkit-train searches (--plugin-dir, AMPKIT_PLUGIN_PATH, the built-in folder).
RegistryOptions registry_options(const TrainConfig& cfg);

// One training run: strategies, workload, optimizer, Trainer, then the loop and the summary.
class Session {
 public:
  explicit Session(const TrainConfig& cfg);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The whole run; returns the process exit status (0, aborted or interrupted). Errors throw.
  int run();

 private:
  // session_setup.cpp: everything before the first step, in order.
  void load_strategies();
  void set_threads_and_device();
  void build_workload();
  void rendezvous();
  std::vector<std::pair<std::string, std::string>> shared_settings() const;
  void build_trainer();
  void enable_data_parallel();
  // session_loop.cpp: the per-step host loop (docs/architecture.md, "One host step").
  void train();
  void train_deferred();
  // Where a step sits in the data: its number, data step (rollbacks skip data), epoch, first batch.
  struct StepPlace {
    int64_t step = 0, data_step = 0, epoch = 0, first_batch = 0;
  };
  StepPlace place_step(int64_t step);
  std::function<at::Tensor(int)> step_forward(int64_t step, int64_t first_batch);
  template <typename Run>
  auto with_model_errors(Run run) -> decltype(run());
  void check_faults_reached() const;
  StepOutcome run_step(int64_t step, int64_t first_batch);
  bool record_step(const StepPlace& at, const StepOutcome& out);
  void update_host_state(int64_t step, const StepOutcome& out);
  StepRecord step_metrics(const StepPlace& at, const StepOutcome& out, double sps, double now);
  // Trainer::enable_deferred_step where --host-sync asks for it (session_setup.cpp).
  void choose_host_sync();
  // run_summary.cpp
  RunSummary summary(double train_seconds) const;
  int finish(double train_seconds);

  const TrainConfig& cfg_;
  const std::chrono::steady_clock::time_point wall_start_ = std::chrono::steady_clock::now();
  std::unique_ptr<Registry> registry_;
  // Leaked, not destroyed, when an exception leaves a multi-process run: main() still asks the
  // comm backend which rank was lost, and destroying a broken process group can block.
  StrategySet* strategies_ = nullptr;
  at::Device device_{at::kCPU};
  std::unique_ptr<Workload> workload_;
  Fp8Linears* fp8_ = nullptr;  // the workload's, under --fp8
  int64_t fp8_nonfinite_ = 0;  // non-finite amaxes the last fp8 update saw (its scales kept)
  std::unique_ptr<FaultInjector> injector_;
  RollbackPlan rollback_plan_;
  bool is_root_ = true;  // rank 0 writes metrics, summary, checkpoints and the progress line
  std::vector<std::string> warnings_;
  bool report_underflow_ = false;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t steps_per_epoch_ = 1, total_steps_ = 0;
  std::unique_ptr<Trainer> trainer_;
  HostState state_;
  std::unique_ptr<SessionObjects> objects_;
  std::unique_ptr<CheckpointKeeper> checkpoints_;
  std::unique_ptr<RollbackKeeper> rollbacks_;
  std::unique_ptr<NanReporter> nan_reports_;
  std::string resumed_from_, abort_reason_;
  bool aborted_by_scaler_ = false;
  std::string host_sync_ = "step", host_sync_reason_;  // the step that ran, and why (the summary's)
  int stop_ = 0;  // the signal that stopped training (any rank's), read once after the loop
  // The loop's own state.
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<LayerNormWriter> layer_norms_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<ProgressLine> progress_;
  int64_t first_step_ = 0, epoch_ = -1;
  double samples_per_step_ = 0, last_time_ = 0;
  double last_exchange_ = 0;  // seconds into training of the last step's exchange of values
  int agreed_stop_ = 0;       // with several ranks, all stop after the same step
  std::chrono::steady_clock::time_point train_start_;
};

}  // namespace ampkit::train
