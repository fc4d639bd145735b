// A session's set-up, in order: strategies, threads and device, workload, rendezvous, optimizer
// and Trainer, resume, data parallelism. Every input is checked before the rendezvous, so a bad
// option fails each rank on its own instead of one rank leaving the others waiting.
#include <ATen/Parallel.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ampkit/device_support.h"
#include "ampkit/error.h"
#include "ampkit/fused_adamw.h"
#include "ampkit/kernel_check.h"
#include "ampkit/plugin_call.h"
#include "config/fault_spec.h"
#include "config/fp8_trace_option.h"
#include "config/option_builders.h"
#include "config/option_table.h"
#include "session/checkpoints.h"
#include "session/nan_reports.h"
#include "session/precision_checks.h"
#include "session/pytorch_files.h"
#include "session/rank_sync.h"
#include "session/session.h"
#include "session/stop_signals.h"
#include "session/thread_policy.h"
#include "workloads/registry.h"

namespace ampkit::train {

namespace {

// Rank 0 serves the TCP store on --master-port: a port another program holds is named now, in
// one line, instead of failing at the rendezvous after the other ranks waited for it. Bound as
// the store binds it (SO_REUSEADDR, every address), then released at once.
void check_store_port_free(const DistributedConfig& d) {
  if (d.world_size == 1 || d.rank != 0 || d.store != "tcp") return;
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");  // torchrun's agent serves it
  if (agent != nullptr && std::string(agent) == "True") return;
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool v6 = fd >= 0;
  const int sock = v6 ? fd : ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return;  // no socket at all: the store's own error says more
  const int on = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int rc;
  if (v6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(d.master_port));
    rc = ::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(d.master_port));
    rc = ::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  const int error = errno;
  ::close(sock);
  if (rc != 0 && (error == EADDRINUSE || error == EACCES))
    throw Error(ErrorCategory::usage,
                "--master-port " + std::to_string(d.master_port) + " on this node (rank 0 " +
                    "hosts the rendezvous store there) is " +
                    (error == EADDRINUSE ? "in use by another program" : "not allowed") +
                    "; pick a free port (ampkit-launch --master-port 0 picks one)");
}

}  // namespace

Session::Session(const TrainConfig& cfg)
    : cfg_(cfg), registry_(std::make_unique<Registry>(registry_options(cfg))) {}

Session::~Session() {
  if (std::uncaught_exceptions() > 0 && multi_rank_comm != nullptr) return;  // see strategies_
  delete strategies_;
}

void Session::load_strategies() {
  std::map<std::string, StrategyChoice> choices;
  for (const KindInfo& k : kKinds) {
    const std::string kind = k.name;
    const auto chosen = cfg_.plugins.find(kind);
    if (optional_kind(k) && (chosen == cfg_.plugins.end() || chosen->second.empty())) continue;  // not named
    StrategyChoice& c = choices[kind];
    c.name = cfg_.plugins.at(kind);
    if (const auto it = cfg_.plugin_options_cli.find(kind); it != cfg_.plugin_options_cli.end())
      c.options.command_line = it->second;
    if (const auto it = cfg_.plugin_options_file.find(kind); it != cfg_.plugin_options_file.end())
      c.options.config_file = it->second;
    c.options.config_file_name = cfg_.config_file;
    c.options.precision = cfg_.precision;  // picks per-precision defaults ("default for fp16")
  }
  strategies_ = StrategySet::load(*registry_, choices).release();
}

void Session::set_threads_and_device() {
  const int threads =
      threads_for_rank(cfg_.threads, cfg_.dist.nproc_per_node, std::getenv("OMP_NUM_THREADS") != nullptr,
                       std::thread::hardware_concurrency());
  if (threads > 0) at::set_num_threads(threads);
  if (cfg_.device == "cuda" && !torch::cuda::is_available())
    throw Error(ErrorCategory::usage, "--device cuda, but no CUDA device is visible to LibTorch");
  if (cfg_.device == "cuda")
    if (const auto capability = cuda_compute_capability(0))
      if (const std::string problem = cuda_precision_problem(cfg_.precision, *capability); !problem.empty())
        throw Error(ErrorCategory::usage,
                    "--precision " + problem + ": use --precision fp16 with --scaler dynamic");
  device_ = at::Device(cfg_.device == "cuda" ? at::kCUDA : at::kCPU);
}

void Session::build_workload() {
  torch::manual_seed(cfg_.seed);
  workload_ = make_workload(cfg_, device_);
  if (Fp8Recipe* recipe = strategies_->fp8_recipe()) {
    const std::string name = strategies_->selected("fp8_recipe").plugin->info().name;
    fp8_ = workload_->enable_fp8(*recipe, name);
    if (fp8_ == nullptr)
      throw Error(ErrorCategory::usage,
                  "--fp8 " + name + ": workload " + cfg_.workload +
                      " has no layers ampkit-train can run in fp8 (a scripted model's are "
                      "its own: convert it with ampkit.fp8 in Python; docs/fp8.md)");
  }
  if (const std::string trace = ampkit::options::workload_values<Fp8TraceOption>(cfg_).file;
      !trace.empty() && !fp8_)
    throw Error(ErrorCategory::usage,
                "--fp8-trace " + trace + ": the run has no fp8 layers to trace; add --fp8 RECIPE");
  std::vector<Fault> faults;
  for (const auto& spec : cfg_.inject) faults.push_back(parse_fault(spec));
  validate_faults(faults, workload_->model().hook_points(), cfg_.dist.world_size);
  injector_ = std::make_unique<FaultInjector>(faults);
  rollback_plan_ = strategies_->nan_policy().rollback_plan();
  if (rollback_plan_.from_checkpoint && cfg_.checkpoint_dir.empty())
    throw Error(ErrorCategory::usage,
                "nan_policy '" + strategies_->selected("nan_policy").plugin->info().name +
                    "' rolls back to the newest checkpoint (snapshot=checkpoint): give --checkpoint-dir");
}

// What every rank must agree on: the options the table marks same_on_every_rank and the
// strategies' options (where each rank writes its files, its faults to inject and its device are
// its own business).
std::vector<std::pair<std::string, std::string>> Session::shared_settings() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : cfg_.settings)
    if (host_option(s.name).same_on_every_rank) out.emplace_back("--" + s.name, s.value);
  for (const auto& strategy : strategies_->all())
    for (const auto& [name, value] : strategy.options.values.all())
      out.emplace_back(strategy.kind + "." + name, value);
  return out;
}

void Session::rendezvous() {
  CommBackend& comm = strategies_->comm();
  const std::string name = strategies_->selected("comm").plugin->info().name;
  check_store_port_free(cfg_.dist);
  try {
    set_in_rendezvous(true);
    comm.init(cfg_.dist);
    set_in_rendezvous(false);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::distributed, "comm '" + name + "': " + e.what());
  }
  if (comm.world_size() != cfg_.dist.world_size || comm.rank() != cfg_.dist.rank)
    throw Error(ErrorCategory::distributed,
                "comm '" + name + "' reports rank " + std::to_string(comm.rank()) + " of " +
                    std::to_string(comm.world_size()) + ", the job says rank " +
                    std::to_string(cfg_.dist.rank) + " of " + std::to_string(cfg_.dist.world_size));
  if (comm.world_size() > 1) multi_rank_comm = &comm;
  is_root_ = comm.rank() == 0;
  check_same_settings(comm, device_, shared_settings());
  // One verdict on ampkit's kernels for all ranks (kernel_check.h): where any rank's check refused
  // them, every rank takes the foreach recipe and the synchronous step, or their sums would differ.
  // Only where a verdict is asked for later: a GPU's statistics, or the deferred step.
  if (comm.world_size() > 1 && (device_.is_cuda() || cfg_.host_sync == "deferred"))
    agree_kernel_refusal(device_, gather_strings(comm, kernel_refusal(device_), device_));
  std::vector<PrecisionAdvice> advice;
  for (const auto& w : cfg_.config_warnings) advice.push_back({PrecisionAdvice::Level::warning, w});
  for (auto& a : precision_warnings(precision_facts(cfg_, *strategies_))) advice.push_back(std::move(a));
  warnings_.clear();
  for (const auto& a : advice) {
    warnings_.push_back(a.summary_line());
    if (is_root_)
      std::fprintf(stderr, "ampkit-train: %s: %s\n",
                   a.level == PrecisionAdvice::Level::note ? "note" : "warning", a.text.c_str());
  }
  // Untrusted plugins loaded under --allow-untrusted-plugins: printed when loaded, kept here.
  warnings_.insert(warnings_.end(), registry_->warnings().begin(), registry_->warnings().end());
  // About speed, not about the run's numbers: printed, not counted among the summary's warnings.
  if (is_root_ && device_.is_cpu())
    if (const std::string note = cpu_precision_note(cfg_.precision, cpu_capabilities()); !note.empty())
      std::fprintf(stderr, "ampkit-train: %s\n", note.c_str());
  report_underflow_ = reports_underflow(cfg_, strategies_->scaler());
}

void Session::build_trainer() {
  for (const auto& [name, tensor] : workload_->model().named_parameters()) {
    if (!tensor.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(tensor);
  }
  if (cfg_.optimizer == "adamw")
    optimizer_ = std::make_unique<FusedAdamW>(
        params_, torch::optim::AdamWOptions(cfg_.lr).weight_decay(cfg_.weight_decay));
  else
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params_, torch::optim::SGDOptions(cfg_.lr).momentum(0.9).weight_decay(cfg_.weight_decay));
  steps_per_epoch_ = workload_->batches_per_epoch() / cfg_.accumulate;
  if (steps_per_epoch_ < 1)
    throw Error(ErrorCategory::usage, "--batch-size x --accumulate exceeds one epoch of " + cfg_.workload);
  total_steps_ = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * steps_per_epoch_;
  LrSchedule schedule;
  schedule.kind = cfg_.lr_schedule == "cosine" ? LrSchedule::Kind::cosine : LrSchedule::Kind::constant;
  schedule.base_lr = cfg_.lr;
  schedule.warmup_steps = cfg_.warmup_steps;
  schedule.total_steps = total_steps_;
  StrategySet& s = *strategies_;
  trainer_ = std::make_unique<Trainer>(
      cfg_.precision, cfg_.accumulate, params_, names_, *optimizer_,
      TrainerStrategies{&s.scaler(), &s.clipper(), &s.nan_policy(), &s.comm()}, schedule);
  RunInfo info;
  info.rank = s.comm().rank();
  info.world_size = s.comm().world_size();
  trainer_->start(info);
  // On a GPU, say once why the statistics do not run in ampkit's own kernel.
  if (!trainer_->stats_recipe_fallback().empty()) {
    warnings_.push_back(trainer_->stats_recipe_fallback());
    if (is_root_) std::fprintf(stderr, "ampkit-train: warning: %s\n", warnings_.back().c_str());
  }
  objects_.reset(
      new SessionObjects{cfg_, workload_->model(), params_, *optimizer_, *trainer_, s, state_, fp8_});
}

// Every rank holds the checkpoint's (or its own seed's) parameters; from here rank 0's are
// everyone's, and gradients are averaged by torch's DDP Reducer during backward.
void Session::enable_data_parallel() {
  DataParallelOptions dp = cfg_.data_parallel;
  for (const auto& [name, buffer] : workload_->model().named_buffers()) dp.buffers.push_back(buffer);
  trainer_->enable_data_parallel(dp);
}

// --host-sync: the deferred step where it was asked for (deferred; auto on a GPU) and can run,
// else the synchronous one, with why in the summary. One warning line where the user asked for it
// (deferred) or a chosen strategy has no device form; auto says nothing about an optimizer or a
// world size that rules it out (every multi-GPU run would warn).
void Session::choose_host_sync() {
  if (cfg_.host_sync == "step") {
    host_sync_reason_ = "--host-sync step";
    return;
  }
  if (cfg_.host_sync == "auto" && !device_.is_cuda()) {
    host_sync_reason_ =
        "auto on the CPU: no launch queue to keep full, and the synchronous step is the cheaper one there";
    return;
  }
  std::string kind;
  std::string why = trainer_->enable_deferred_step(
      kind, /*tensor_norms=*/!cfg_.layer_norms_file.empty() || cfg_.layer_norms_top_k > 0);
  if (why.empty()) {
    host_sync_ = "deferred";
    host_sync_reason_ = "--host-sync " + cfg_.host_sync + ": every strategy has a device form";
    return;
  }
  if (!kind.empty()) why = kind + " '" + strategies_->selected(kind).plugin->info().name + "' " + why;
  host_sync_reason_ = "--host-sync " + cfg_.host_sync + ", but " + why;
  if (cfg_.host_sync == "auto" && kind.empty()) return;
  warnings_.push_back("the step stays synchronous: " + why);
  if (is_root_) std::fprintf(stderr, "ampkit-train: warning: %s\n", warnings_.back().c_str());
}

// The whole run, numbered as docs/architecture.md's "One ampkit-train run".
int Session::run() {
  load_strategies();  // 1
  if (cfg_.print_config) {
    print_config(cfg_, *strategies_);
    return 0;
  }
  strategies_->create(static_cast<unsigned>(cfg_.plugin_timeout));
  validate(cfg_.dist, strategies_->selected("comm").plugin->info().name, comm_facts(strategies_->comm()),
           torch::cuda::is_available());
  // From here a crash or exit() in a plugin's own thread is reported too (plugin_call.h); the
  // guard ends it however run() ends, so the host's own exit is never taken for a plugin's.
  struct RunInProgress {
    RunInProgress() { set_run_in_progress(true); }
    ~RunInProgress() { set_run_in_progress(false); }
  } in_progress;
  set_threads_and_device();  // 2
  build_workload();
  rendezvous();     // 3
  build_trainer();  // 4
  const bool writes_checkpoints = !cfg_.checkpoint_dir.empty() && strategies_->comm().rank() == 0;
  resumed_from_ = resume(*objects_, warnings_);  // 5
  if (cfg_.restart_count > 0 && cfg_.checkpoint_dir.empty() && is_root_)
    std::fprintf(stderr,
                 "ampkit-train: warning: restart %d of the job without --checkpoint-dir: training starts "
                 "again from step 0\n",
                 cfg_.restart_count);
  if (!cfg_.init_from.empty() && resumed_from_.empty()) init_from_pytorch(*objects_);
  if (!cfg_.init_from.empty() && !resumed_from_.empty())
    std::fprintf(stderr, "ampkit-train: note: --init-from %s not used: resumed from a checkpoint\n",
                 cfg_.init_from.c_str());
  enable_data_parallel();
  first_step_ = trainer_->steps_attempted();
  metrics_ = std::make_unique<MetricsWriter>(is_root_ ? cfg_.metrics_file : "", first_step_);
  layer_norms_ = std::make_unique<LayerNormWriter>(is_root_ ? cfg_.layer_norms_file : "", first_step_);
  // Only rank 0 writes, and only it pays the trace's reads.
  if (const std::string trace = ampkit::options::workload_values<Fp8TraceOption>(cfg_).file;
      is_root_ && !trace.empty())
    fp8_->open_trace(trace);
  tensorboard_ = std::make_unique<TensorBoardWriter>(is_root_ ? cfg_.tensorboard_dir : "", first_step_);
  checkpoints_ = std::make_unique<CheckpointKeeper>(*objects_, writes_checkpoints, steps_per_epoch_);
  rollbacks_ = std::make_unique<RollbackKeeper>(*objects_, rollback_plan_, *checkpoints_);
  nan_reports_ = std::make_unique<NanReporter>(*objects_, *workload_, strategies_->comm().rank());
  choose_host_sync();
  train();  // 6
  stop_ = stop_signal();
  checkpoints_->at_end();
  if (!checkpoints_->last().empty() && (stop_ != 0 || cfg_.checkpoint_every == 0))
    std::fprintf(stderr, "ampkit-train: checkpoint written: %s\n", checkpoints_->last().c_str());
  const double train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start_).count();
  return finish(train_seconds);  // 7
}

}  // namespace ampkit::train
