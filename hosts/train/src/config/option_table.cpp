// The table of ampkit-train's options: every option's one declaration.
#include "config/option_table.h"

#include <ampkit/kind_flags.h>
#include <ampkit/kinds.h>

#include <algorithm>
#include <cctype>

#include "ampkit/error.h"
#include "ampkit/strategy_set.h"
#include "config/fault_spec.h"
#include "config/fp8_trace_option.h"
#include "config/option_builders.h"
#include "config/workload_options.h"

namespace ampkit {

namespace {

using namespace options;  // NOLINT: the table reads as declarations

std::string capitalized(std::string s) {
  s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// --precision's choices: every precision, as to_string spells it.
std::vector<std::string> precisions() {
  std::vector<std::string> names;
  for (const Precision p : kPrecisions) names.emplace_back(to_string(p));
  return names;
}

// --workload: its choices and help from the workload registry.
HostOption workload_option() {
  std::vector<std::string> names;
  std::string help = "What to train:";
  for (const WorkloadOptions& w : workload_options()) {
    names.push_back(w.name);
    help += (names.size() == 1 ? " " : " | ") + w.name + " (" + w.summary + ")";
  }
  return text("workload", "fashion-mnist", help + ". Each has its own options (below).",
              field(&TrainConfig::workload))
      .one_of(names)
      .shared_by_ranks();
}

std::vector<HostOption> run_options() {
  std::string selectors;
  for (const KindInfo& k : kKinds) selectors += (selectors.empty() ? "--" : "/--") + kind_flag(k);
  HostOption help =
      flag("help", "Show this help; with " + selectors + " NAME also that plugin's options.", {});
  help.short_name = 'h';
  help.command_line_only = true;
  help.listed = false;
  return {
      help,
      workload_option(),
      text("precision", "fp32",
           "Autocast precision: " + precision_names(" | ") + ". Master weights stay fp32.",
           [](TrainConfig& cfg, const HostOptionValue& v) { cfg.precision = *parse_precision(v.text); })
          .one_of(precisions())
          .shared_by_ranks(),
      // Bounded so that steps x batches x samples stays far from int64's range.
      integer("epochs", nullptr, "Passes over the training set (default 1 when --steps is not given).",
              field(&TrainConfig::epochs))
          .range(1, 1e6)
          .shared_by_ranks(),
      integer("steps", nullptr, "Optimizer steps to attempt (skipped steps count); excludes --epochs.",
              field(&TrainConfig::steps))
          .range(1, 1e12)
          .shared_by_ranks(),
      integer("batch-size", "64", "Samples per micro-batch.", field(&TrainConfig::batch_size))
          .range(1, 1 << 20)
          .shared_by_ranks(),
      integer("accumulate", "1", "Micro-batches per optimizer step (gradient accumulation).",
              field(&TrainConfig::accumulate))
          .range(1, 4096)
          .shared_by_ranks(),
      number("lr", "0.001", "Peak learning rate.", field(&TrainConfig::lr)).above(0).shared_by_ranks(),
      row("seed", OptionType::unsigned_integer, std::string("0"),
          "Seed for initialisation, data order and synthetic data.", field(&TrainConfig::seed))
          .shared_by_ranks(),
      text(
          "optimizer", "adamw",
          "Optimizer: adamw (one fused pass per parameter, as torch.optim.AdamW(fused=True)) | sgd (momentum "
          "0.9).",
          field(&TrainConfig::optimizer))
          .one_of({"adamw", "sgd"})
          .shared_by_ranks(),
      text("host-sync", "auto",
           "When the host reads a step's statistics: step (every step, before its update) | deferred (the "
           "decisions are made on the device and the figures reach the host one step late: no host read "
           "on a healthy step; needs --optimizer adamw and a device form for every strategy (and, with "
           "several ranks, a comm backend with a c10d process group: gloo, nccl), else the step stays "
           "synchronous with one line saying why) | auto (deferred on a GPU where it can be, step "
           "otherwise). Metrics, summary and checkpoints are the same either way.",
           field(&TrainConfig::host_sync))
          .one_of({"auto", "step", "deferred"}),
      number("weight-decay", "0.01", "Weight decay (decoupled for adamw).", field(&TrainConfig::weight_decay))
          .range(0, std::nullopt)
          .shared_by_ranks(),
      text("lr-schedule", "constant",
           "constant | cosine (after warm-up, to 0 at the run's last step; skipped steps shorten it, "
           "docs/configuration.md).",
           field(&TrainConfig::lr_schedule))
          .one_of({"constant", "cosine"})
          .shared_by_ranks(),
      integer("warmup-steps", "0", "Linear learning-rate warm-up over this many taken steps.",
              field(&TrainConfig::warmup_steps))
          .range(0, std::nullopt)
          .shared_by_ranks(),
      text("device", "cpu", "cpu | cuda (the first visible GPU).", field(&TrainConfig::device))
          .one_of({"cpu", "cuda"}),
      integer("threads", "0", "CPU threads for LibTorch; 0: cores / ranks on the node, or OMP_NUM_THREADS.",
              field(&TrainConfig::threads))
          .range(0, 1024),
  };
}

std::vector<HostOption> plugin_options() {
  std::vector<HostOption> out;
  for (const KindInfo& k : kKinds) {
    // The first selector says where names come from; the others need not repeat it.
    std::string help = capitalized(k.title) + " plugin: a name" +
                       (out.empty() ? " (see ampkit-plugins list) or a path to a .so." : " or a path.");
    const std::string kind = k.name;
    // derive_defaults() picks the scaler fp16 needs.
    if (kind == "scaler") help += " The default is dynamic for --precision fp16, none otherwise.";
    // An optional kind (an fp8 recipe) serves the workload's fp8 layers, and is none unless named.
    if (optional_kind(k))
      help +=
          " The workload's linear layers then multiply in fp8 by its scales (char-gpt, synthetic; "
          "docs/fp8.md); empty: no fp8.";
    out.push_back(text(kind_flag(k).c_str(), default_plugin(kind), help,
                       [kind](TrainConfig& cfg, const HostOptionValue& v) { cfg.plugins[kind] = v.text; })
                      .shared_by_ranks());
  }
  out.push_back(list("opt", "Plugin option KIND.OPTION=VALUE, e.g. scaler.scale=512 (repeatable).",
                     [](TrainConfig& cfg, const HostOptionValue& v) {
                       for (const auto& item : v.list) store_plugin_option(cfg, item);
                     }));
  out.back().listed = false;
  out.push_back(text("config", nullptr,
                     "YAML file with any of these options (keys as here, without --; plugin options under "
                     "opt: {KIND: {OPTION: VALUE}}).",
                     field(&TrainConfig::config_file)));
  out.back().command_line_only = true;
  out.push_back(
      list("plugin-dir",
           "Folder searched for plugins before AMPKIT_PLUGIN_PATH and the built-in folder (repeatable).",
           field(&TrainConfig::plugin_dirs)));
  // A trust override is the user's own decision at the command line, never a file's.
  out.push_back(
      flag("allow-untrusted-plugins",
           "Load plugin files writable by others or owned by another user (loudly; command line only).",
           field(&TrainConfig::allow_untrusted_plugins)));
  out.back().command_line_only = true;
  out.push_back(
      integer("plugin-timeout", "30",
              "Seconds a plugin may take to load (in the probe child), to construct its strategy, or in "
              "any later call into it; past that the run stops with exit 3 naming the plugin and the call "
              "(ampkit.GradScaler's plugin_timeout= is the same limit).",
              field(&TrainConfig::plugin_timeout))
          .range(1, 86400));
  return out;
}

std::vector<HostOption> output_and_workload_options() {
  return {
      text("metrics", "", "Write one JSON line of metrics per step to this file.",
           field(&TrainConfig::metrics_file)),
      text("summary", "", "Write the run summary as JSON to this file.", field(&TrainConfig::summary_file)),
      integer("layer-norms-top-k", "3",
              "Add the K parameters with the largest unscaled gradient norms to each metrics record "
              "(\"top_layers\", largest first); 0 turns it off.",
              field(&TrainConfig::layer_norms_top_k))
          .range(0, 1000000),
      text("tensorboard", "",
           "TensorBoard event files in this folder: the metrics' scalars per step; empty: off.",
           field(&TrainConfig::tensorboard_dir)),
      text("fp8-trace", "",
           "With --fp8: write per step each fp8 tensor's amax, 64 largest magnitudes and log2 histogram, as "
           "cast, to this JSON-lines file (docs/fp8.md). A measurement: it costs host reads; empty: off.",
           workload_field(&Fp8TraceOption::file)),
      text("layer-norms", "",
           "Write every parameter's unscaled gradient norm at every step to this CSV file "
           "(step,name,grad_norm).",
           field(&TrainConfig::layer_norms_file)),
      integer("eval-batches", "0", "Test batches to evaluate at the end; 0 evaluates the whole test set.",
              field(&TrainConfig::eval_batches))
          .range(0, std::nullopt),
  };
}

std::vector<HostOption> checkpoint_and_nan_options() {
  return {
      text("checkpoint-dir", "",
           "Folder for checkpoints (step-N folders and a 'latest' pointer); empty: no checkpoints. Written "
           "at the end, every --checkpoint-every steps and on SIGTERM/SIGINT/SIGUSR1.",
           field(&TrainConfig::checkpoint_dir)),
      integer(
          "checkpoint-every", "0",
          "Steps (attempted) between checkpoints; 0: only at the end of training and when a signal stops it.",
          field(&TrainConfig::checkpoint_every))
          .range(0, std::nullopt)
          .shared_by_ranks(),
      integer("keep-checkpoints", "3",
              "Newest complete checkpoints to keep in --checkpoint-dir; older ones are deleted after a new "
              "one is complete.",
              field(&TrainConfig::keep_checkpoints))
          .range(1, 1000000),
      text("resume", "",
           "auto (the checkpoint named by latest in --checkpoint-dir, else the newest valid one; an empty "
           "folder starts fresh, one whose checkpoints are all corrupt is an error) | none (start fresh) | "
           "PATH of a step-N folder.",
           field(&TrainConfig::resume)),
      flag("weights-only",
           "With --resume: load only the parameters (another scaler/clipper/optimizer allowed); counters, "
           "optimizer and plugin states start fresh.",
           field(&TrainConfig::weights_only)),
      text("init-from", "",
           "Start at step 0 from a torch.save file: a model state_dict, or {model, optimizer, scaler}.",
           field(&TrainConfig::init_from)),
      list("inject",
           "Testing and demos: plant a fault, "
           "KIND@step=N[,layer=NAME][,rank=R][,target=output|grad][,factor=X]; "
           "KIND nan|inf|spike, layer a module path (default: the loss), factor the spike multiplier (1000) "
           "(repeatable; docs/troubleshooting-nan.md).",
           [](TrainConfig& cfg, const HostOptionValue& v) {
             for (const auto& spec : v.list) train::parse_fault(spec);  // throws with the spec's problem
             cfg.inject = v.list;
           }),
      integer("nan-locate", "5",
              "Re-run the first N bad steps with every module observed and write a locator report for each "
              "(costs nothing on healthy steps); 0 turns the locator off.",
              field(&TrainConfig::nan_locate))
          .range(0, std::nullopt)
          .shared_by_ranks(),
      text("nan-report-dir", "",
           "Folder for NaN locator reports (nan-report-step-N-rank-R.json); empty: the folder of --summary, "
           "else of --metrics, else the current folder.",
           field(&TrainConfig::nan_report_dir)),
  };
}

// Where this process sits in the job: the launchers' variables fill these (torchrun's first).
std::vector<HostOption> job_layout_options() {
  return {
      integer(
          "world-size", "1",
          "Distributed: processes in the job (torchrun's WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE).",
          dist_field(&DistributedConfig::world_size))
          .range(1, 1 << 20)
          .from_environment({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"})
          .shared_by_ranks(),
      integer(
          "rank", "0",
          "Distributed: this process's rank in [0, world size) (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK).",
          dist_field(&DistributedConfig::rank))
          .range(0, (1 << 20) - 1)
          .from_environment({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}),
      integer("local-rank", "0",
              "Distributed: rank on this node; picks the GPU with nccl (LOCAL_RANK, SLURM_LOCALID, "
              "OMPI_COMM_WORLD_LOCAL_RANK).",
              dist_field(&DistributedConfig::local_rank))
          .range(0, (1 << 20) - 1)
          .from_environment({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}),
      integer("nnodes", "1",
              "Distributed: nodes in the job (SLURM_NNODES; torchrun: WORLD_SIZE / LOCAL_WORLD_SIZE).",
              dist_field(&DistributedConfig::nnodes))
          .range(1, 1 << 20)
          .from_environment({"SLURM_NNODES"}),
      integer("node-rank", "0", "Distributed: this node's index in [0, nnodes) (GROUP_RANK, SLURM_NODEID).",
              dist_field(&DistributedConfig::node_rank))
          .range(0, (1 << 20) - 1)
          .from_environment({"GROUP_RANK", "SLURM_NODEID"}),
      integer("nproc-per-node", "1",
              "Distributed: processes per node; default world size / nnodes (LOCAL_WORLD_SIZE, "
              "SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE).",
              dist_field(&DistributedConfig::nproc_per_node))
          .range(1, 1 << 20)
          .from_environment({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"}),
      text("master-addr", "127.0.0.1",
           "Distributed: host of rank 0, which serves the rendezvous TCP store (MASTER_ADDR; under SLURM the "
           "first host of SLURM_JOB_NODELIST).",
           dist_field(&DistributedConfig::master_addr))
          .from_environment({"MASTER_ADDR", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}),
      integer("master-port", "29500",
              "Distributed: TCP port of the rendezvous store on --master-addr (MASTER_PORT).",
              dist_field(&DistributedConfig::master_port))
          .range(1, 65535)
          .from_environment({"MASTER_PORT"}),
      integer("restart-count", "0",
              "Distributed: restarts of the job so far (TORCHELASTIC_RESTART_COUNT, set by torchrun and "
              "ampkit-launch "
              "--max-restarts); above 0 with --checkpoint-dir, --resume defaults to auto.",
              field(&TrainConfig::restart_count))
          .range(0, 1 << 20)
          .from_environment({"TORCHELASTIC_RESTART_COUNT"}),
  };
}

std::vector<HostOption> data_parallel_and_progress_options() {
  HostOption print_config =
      flag("print-config", "Print every effective setting and where it came from, then exit.", {});
  print_config.command_line_only = true;
  print_config.listed = false;
  return {
      text("rendezvous", "tcp",
           "Distributed: tcp (a c10d TCPStore at --master-addr:--master-port) | file:PATH (a c10d FileStore "
           "on a filesystem every rank shares; the file must not exist from an earlier job).",
           [](TrainConfig& cfg, const HostOptionValue& v) {
             if (v.text != "tcp" && !(v.text.rfind("file:", 0) == 0 && v.text.size() > 5))
               throw Error(ErrorCategory::usage,
                           "--rendezvous must be tcp or file:PATH, got '" + v.text + "'");
             cfg.dist.store = v.text;
           }),
      text("device-ids", "", "Distributed with nccl: this rank's CUDA device index; empty: --local-rank.",
           store_device_ids),
      number(
          "bucket-cap-mb", "25",
          "Distributed: gradient bucket size in MiB for the all-reduce overlapped with backward (torch DDP's "
          "bucket_cap_mb).",
          data_parallel_field(&DataParallelOptions::bucket_cap_mb))
          .range(0, 65536)
          .above(0)
          .shared_by_ranks(),
      boolean(
          "find-unused-parameters", "false",
          "Distributed: true if some parameters get no gradient in a step (costs a graph traversal per step; "
          "torch DDP's option).",
          data_parallel_field(&DataParallelOptions::find_unused_parameters))
          .shared_by_ranks(),
      boolean(
          "broadcast-buffers", "true",
          "Distributed: send rank 0's module buffers (e.g. BatchNorm statistics) to every rank before each "
          "step.",
          data_parallel_field(&DataParallelOptions::broadcast_buffers))
          .shared_by_ranks(),
      boolean("gradient-as-bucket-view", "false",
              "Distributed: gradients are views into the all-reduce buckets (saves one gradient-sized copy "
              "and its memory).",
              data_parallel_field(&DataParallelOptions::gradient_as_bucket_view))
          .shared_by_ranks(),
      number(
          "dist-timeout", "300",
          "Distributed: seconds the rendezvous and every collective may take; a lost or hung rank makes the "
          "others exit (code 7) after at most this plus a few seconds.",
          dist_field(&DistributedConfig::timeout_seconds))
          .range(1, std::nullopt),
      flag("check-ranks",
           "Distributed: after each step, check that every rank took the same decision with the same scale "
           "(one more small collective per step; for debugging, and tests that prove ranks agree).",
           field(&TrainConfig::check_ranks))
          .shared_by_ranks(),
      text("progress", "auto",
           "auto (a redrawn line on a terminal, a plain line every --log-every steps otherwise) | never.",
           field(&TrainConfig::progress))
          .one_of({"auto", "never"}),
      integer("log-every", "50", "Steps between plain progress lines when not on a terminal.",
              field(&TrainConfig::log_every))
          .range(1, std::nullopt),
      print_config,
  };
}

}  // namespace

const std::vector<HostOption>& host_option_table() {
  static const std::vector<HostOption> table = [] {
    std::vector<HostOption> all;
    for (auto part :
         {run_options(), plugin_options(), output_and_workload_options(), checkpoint_and_nan_options(),
          job_layout_options(), data_parallel_and_progress_options()})
      all.insert(all.end(), part.begin(), part.end());
    for (const WorkloadOptions& w : workload_options())
      for (HostOption o : w.options()) {
        o.group = "workload " + w.name;
        all.push_back(std::move(o));
      }
    return all;
  }();
  return table;
}

std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const HostOption& o : host_option_table()) names.push_back(o.name);
  return names;
}

const HostOption& host_option(const std::string& name) {
  for (const auto& o : host_option_table())
    if (o.name == name) return o;
  throw Error(ErrorCategory::internal, "ampkit-train has no option --" + name);
}

}  // namespace ampkit
