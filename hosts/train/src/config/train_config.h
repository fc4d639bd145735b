// ampkit-train's configuration: command line > YAML file > defaults, validated, with sources.
#pragma once

#include <ampkit/comm_backend.h>
#include <ampkit/data_parallel.h>
#include <ampkit/step.h>

#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <typeindex>
#include <vector>

namespace ampkit {

// Every field is filled from the option table (config/option_table.cpp), which holds the
// defaults, ranges and help: the values here only make a TrainConfig that was never parsed inert.
struct TrainConfig {
  std::string workload;
  Precision precision = Precision::fp32;
  int64_t epochs = 0;  // exactly one of epochs/steps is in force; neither given: 1 epoch
  int64_t steps = 0;
  int64_t batch_size = 0;
  int accumulate = 0;
  double lr = 0;
  uint64_t seed = 0;
  std::string optimizer;
  double weight_decay = 0;
  std::string lr_schedule;
  int64_t warmup_steps = 0;
  std::string device;
  int threads = 0;  // 0: LibTorch's choice

  // kind -> plugin name or path; kind -> option -> text value, per source.
  std::map<std::string, std::string> plugins;
  std::map<std::string, std::map<std::string, std::string>> plugin_options_cli;
  std::map<std::string, std::map<std::string, std::string>> plugin_options_file;
  std::vector<std::string> plugin_dirs;
  bool allow_untrusted_plugins = false;

  std::string config_file;
  std::vector<std::string> config_warnings;  // about the config file (a DeepSpeed config's unmapped keys)
  std::string metrics_file;
  std::string summary_file;
  int64_t layer_norms_top_k = 0;  // "top_layers" entries per metrics record; 0: none
  std::string tensorboard_dir;    // TensorBoard event files; empty: not written
  std::string layer_norms_file;   // per-parameter norms CSV; empty: not written
  int64_t eval_batches = 0;       // 0: the whole test set
  // Each workload's own options (declared beside its code, workloads/), one struct per workload
  // keyed by its type: read with options::workload_values<T>(cfg) (config/option_builders.h).
  std::map<std::type_index, std::any> workload_values;
  std::string checkpoint_dir;       // empty: no checkpoints
  int64_t checkpoint_every = 0;     // steps between checkpoints; 0: only at the end and on a signal
  int keep_checkpoints = 0;         // newest complete checkpoints kept
  std::string resume;               // empty | "auto" | a checkpoint folder
  bool weights_only = false;        // resume loads parameters only
  int restart_count = 0;            // restarts of the job so far (TORCHELASTIC_RESTART_COUNT)
  std::string init_from;            // a file python's torch.save wrote (state_dict or {model, ...})
  std::vector<std::string> inject;  // --inject fault specs (parsed by parse_fault)
  int64_t nan_locate = 0;           // bad steps the locator re-runs; 0: off
  std::string host_sync;            // auto | step | deferred (Trainer::enable_deferred_step)
  std::string nan_report_dir;       // empty: beside --summary, else --metrics, else "."
  int64_t plugin_timeout = 0;       // seconds a plugin may take to load (probe) or construct
  std::string progress;
  int64_t log_every = 0;

  // Where this process sits in a data-parallel job: command line > environment (torchrun, then
  // SLURM, then Open MPI variables) > config file > default (docs/distributed-training.md).
  DistributedConfig dist;
  DataParallelOptions data_parallel;  // how gradients are bucketed (the engine's, not the backend's)
  bool check_ranks = false;           // cross-check every step's decision across ranks (debug)

  bool help = false;
  bool print_config = false;

  // Every host option in declaration order: name, effective value, source.
  struct Setting {
    std::string name, value, source;
  };
  std::vector<Setting> settings;
};

// Parses argv, the YAML file it names and the launchers' environment against the option table.
// Throws Error(usage) with one clear line.
TrainConfig parse_train_config(int argc, const char* const argv[]);
// Rejects an impossible job layout (rank >= world size, node counts that do not multiply to the
// world size, a one-process comm with several ranks, a comm that needs CUDA without it, ...) with
// Error(usage) and one line; the option table has already checked each value's own range.
// `comm` is the comm plugin's name and `facts` what it declares (comm_facts()).
void validate(const DistributedConfig& dist, const std::string& comm, const CommFacts& facts,
              bool cuda_available);
// The --help text for the host options.
std::string train_options_help();

}  // namespace ampkit
