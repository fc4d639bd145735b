// Command line and YAML parsing for ampkit-train, on Boost.Program_options and yaml-cpp.
#include "config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>

#include "ampkit/error.h"
#include "ampkit/fault_injection.h"

namespace po = boost::program_options;

namespace ampkit {

namespace {

const std::vector<std::string> kKinds = {"scaler", "clipper", "nan_policy", "comm"};

po::options_description host_options() {
  po::options_description o("ampkit-train options");
  // clang-format off
  o.add_options()
    ("help,h", "Show this help; with --scaler/--clipper/--nan-policy/--comm NAME also that plugin's options.")
    ("workload", po::value<std::string>()->default_value("fashion-mnist"), "What to train: fashion-mnist (CNN on Fashion-MNIST) | char-gpt (character-level GPT on the fortunes corpus) | synthetic (MLP on generated data).")
    ("precision", po::value<std::string>()->default_value("fp32"), "Autocast precision: fp32 | bf16 | fp16. Master weights stay fp32.")
    ("epochs", po::value<int64_t>(), "Passes over the training set (default 1 when --steps is not given).")
    ("steps", po::value<int64_t>(), "Optimizer steps to attempt (skipped steps count); excludes --epochs.")
    ("batch-size", po::value<int64_t>()->default_value(64), "Samples per micro-batch.")
    ("accumulate", po::value<int>()->default_value(1), "Micro-batches per optimizer step (gradient accumulation).")
    ("lr", po::value<double>()->default_value(1e-3), "Peak learning rate.")
    ("seed", po::value<uint64_t>()->default_value(0), "Seed for initialisation, data order and synthetic data.")
    ("optimizer", po::value<std::string>()->default_value("adamw"), "Optimizer: adamw (one fused pass per parameter, as torch.optim.AdamW(fused=True)) | sgd (momentum 0.9).")
    ("weight-decay", po::value<double>()->default_value(0.01), "Weight decay (decoupled for adamw).")
    ("lr-schedule", po::value<std::string>()->default_value("constant"), "constant | cosine (to 0 over the run, after warm-up).")
    ("warmup-steps", po::value<int64_t>()->default_value(0), "Linear learning-rate warm-up over this many taken steps.")
    ("device", po::value<std::string>()->default_value("cpu"), "cpu | cuda (the first visible GPU).")
    ("threads", po::value<int>()->default_value(0), "CPU threads for LibTorch; 0 keeps LibTorch's choice.")
    ("scaler", po::value<std::string>()->default_value("none"), "Loss scaler plugin: a name (see ampkit-plugins list) or a path to a .so.")
    ("clipper", po::value<std::string>()->default_value("none"), "Gradient clipper plugin: a name or a path.")
    ("nan-policy", po::value<std::string>()->default_value("skip"), "NaN policy plugin: a name or a path.")
    ("comm", po::value<std::string>()->default_value("local"), "Communication backend plugin: a name or a path.")
    ("opt", po::value<std::vector<std::string>>()->composing(), "Plugin option KIND.OPTION=VALUE, e.g. scaler.scale=512 (repeatable).")
    ("config", po::value<std::string>(), "YAML file with any of these options (keys as here, without --; plugin options under opt: {KIND: {OPTION: VALUE}}).")
    ("plugin-dir", po::value<std::vector<std::string>>()->composing(), "Folder searched for plugins before AMPKIT_PLUGIN_PATH and the built-in folder (repeatable).")
    ("allow-untrusted-plugins", po::bool_switch(), "Load plugin files writable by others or owned by another user (loudly).")
    ("metrics", po::value<std::string>()->default_value(""), "Write one JSON line of metrics per step to this file.")
    ("summary", po::value<std::string>()->default_value(""), "Write the run summary as JSON to this file.")
    ("layer-norms-top-k", po::value<int64_t>()->default_value(3), "Add the K parameters with the largest unscaled gradient norms to each metrics record (\"top_layers\", largest first); 0 turns it off.")
    ("layer-norms", po::value<std::string>()->default_value(""), "Write every parameter's unscaled gradient norm at every step to this CSV file (step,name,grad_norm).")
    ("data-dir", po::value<std::string>()->default_value("/usr/share/datasets/fashion-mnist"), "Folder with the Fashion-MNIST IDX .gz files (Debian package dataset-fashion-mnist).")
    ("eval-batches", po::value<int64_t>()->default_value(0), "Test batches to evaluate at the end; 0 evaluates the whole test set.")
    ("synthetic-width", po::value<int64_t>()->default_value(256), "synthetic: hidden width of the MLP.")
    ("synthetic-depth", po::value<int64_t>()->default_value(4), "synthetic: number of hidden layers.")
    ("synthetic-inputs", po::value<int64_t>()->default_value(128), "synthetic: input features.")
    ("synthetic-classes", po::value<int64_t>()->default_value(10), "synthetic: output classes.")
    ("text-dir", po::value<std::string>()->default_value("/usr/share/games/fortunes"), "char-gpt: folder of text files (Debian package fortunes); all files except *.dat and *.u8 are read.")
    ("gpt-layers", po::value<int64_t>()->default_value(2), "char-gpt: transformer blocks.")
    ("gpt-width", po::value<int64_t>()->default_value(128), "char-gpt: embedding width (a multiple of --gpt-heads).")
    ("gpt-heads", po::value<int64_t>()->default_value(4), "char-gpt: attention heads.")
    ("gpt-context", po::value<int64_t>()->default_value(64), "char-gpt: context length in bytes.")
    ("checkpoint-dir", po::value<std::string>()->default_value(""), "Folder for checkpoints (step-N folders and a 'latest' pointer); empty: no checkpoints. Written at the end, every --checkpoint-every steps and on SIGTERM/SIGINT/SIGUSR1.")
    ("checkpoint-every", po::value<int64_t>()->default_value(0), "Steps (attempted) between checkpoints; 0: only at the end of training and when a signal stops it.")
    ("keep-checkpoints", po::value<int>()->default_value(3), "Newest complete checkpoints to keep in --checkpoint-dir; older ones are deleted after a new one is complete.")
    ("resume", po::value<std::string>()->default_value(""), "auto (the checkpoint named by latest in --checkpoint-dir, else the newest valid one; none: fresh start) | PATH of a step-N folder.")
    ("weights-only", po::bool_switch(), "With --resume: load only the parameters (another scaler/clipper/optimizer allowed); counters, optimizer and plugin states start fresh.")
    ("inject", po::value<std::vector<std::string>>()->composing(), "Testing and demos: plant a fault, KIND@step=N[,layer=NAME][,rank=R][,target=output|grad][,factor=X]; KIND nan|inf|spike, layer a module path (default: the loss), factor the spike multiplier (1000) (repeatable; docs/troubleshooting-nan.md).")
    ("nan-locate", po::value<int64_t>()->default_value(5), "Re-run the first N bad steps with every module observed and write a locator report for each (costs nothing on healthy steps); 0 turns the locator off.")
    ("nan-report-dir", po::value<std::string>()->default_value(""), "Folder for NaN locator reports (nan-report-step-N-rank-R.json); empty: the folder of --summary, else of --metrics, else the current folder.")
    ("world-size", po::value<int>()->default_value(1), "Distributed: processes in the job (torchrun's WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE).")
    ("rank", po::value<int>()->default_value(0), "Distributed: this process's rank in [0, world size) (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK).")
    ("local-rank", po::value<int>()->default_value(0), "Distributed: rank on this node; picks the GPU with nccl (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK).")
    ("nnodes", po::value<int>()->default_value(1), "Distributed: nodes in the job (SLURM_NNODES; torchrun: WORLD_SIZE / LOCAL_WORLD_SIZE).")
    ("node-rank", po::value<int>()->default_value(0), "Distributed: this node's index in [0, nnodes) (GROUP_RANK, SLURM_NODEID).")
    ("nproc-per-node", po::value<int>()->default_value(1), "Distributed: processes per node; default world size / nnodes (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE).")
    ("master-addr", po::value<std::string>()->default_value("127.0.0.1"), "Distributed: host of rank 0, which serves the rendezvous TCP store (MASTER_ADDR; under SLURM the first host of SLURM_JOB_NODELIST).")
    ("master-port", po::value<int>()->default_value(29500), "Distributed: TCP port of the rendezvous store on --master-addr, 1..65535 (MASTER_PORT).")
    ("rendezvous", po::value<std::string>()->default_value("tcp"), "Distributed: tcp (a c10d TCPStore at --master-addr:--master-port) | file:PATH (a c10d FileStore on a filesystem every rank shares; the file must not exist from an earlier job).")
    ("device-ids", po::value<std::string>()->default_value(""), "Distributed with nccl: this rank's CUDA device index; empty: --local-rank.")
    ("bucket-cap-mb", po::value<double>()->default_value(25.0), "Distributed: gradient bucket size in MiB for the all-reduce overlapped with backward (torch DDP's bucket_cap_mb).")
    ("find-unused-parameters", po::value<bool>()->default_value(false), "Distributed: true if some parameters get no gradient in a step (costs a graph traversal per step; torch DDP's option).")
    ("broadcast-buffers", po::value<bool>()->default_value(true), "Distributed: send rank 0's module buffers (e.g. BatchNorm statistics) to every rank before each step.")
    ("gradient-as-bucket-view", po::value<bool>()->default_value(false), "Distributed: gradients are views into the all-reduce buckets (saves one gradient-sized copy and its memory).")
    ("dist-timeout", po::value<double>()->default_value(300.0), "Distributed: seconds the rendezvous and every collective may take; a lost or hung rank makes the others exit (code 7) after at most this plus a few seconds.")
    ("progress", po::value<std::string>()->default_value("auto"), "auto (a redrawn line on a terminal, a plain line every --log-every steps otherwise) | never.")
    ("log-every", po::value<int64_t>()->default_value(50), "Steps between plain progress lines when not on a terminal.")
    ("print-config", po::bool_switch(), "Print every effective setting and where it came from, then exit.");
  // clang-format on
  return o;
}

std::vector<std::string> option_names(const po::options_description& o) {
  std::vector<std::string> names;
  for (const auto& opt : o.options()) names.push_back(opt->long_name());
  return names;
}

std::string scalar_text(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar()) throw Error(ErrorCategory::usage, where + " must be a single value");
  return n.as<std::string>();
}

// Turns the YAML file into command-line words so one parser validates both sources.
std::vector<std::string> read_yaml(const std::string& file, TrainConfig& cfg) {
  if (!std::filesystem::exists(file))
    throw Error(ErrorCategory::usage, "config file " + file + " does not exist");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCategory::usage, "config file " + file + " is not valid YAML: " + e.what());
  }
  if (root.IsNull()) return {};
  if (!root.IsMap())
    throw Error(ErrorCategory::usage, "config file " + file + " must be a mapping of option: value");
  const auto known = option_names(host_options());
  std::vector<std::string> words;
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string where = "key '" + key + "' in config file " + file;
    if (key == "opt") {
      if (!item.second.IsMap())
        throw Error(ErrorCategory::usage,
                    where + " must map plugin kinds to options, e.g. opt: {scaler: {scale: 512}}");
      for (const auto& kind_item : item.second) {
        const std::string kind = kind_item.first.as<std::string>();
        if (std::find(kKinds.begin(), kKinds.end(), kind) == kKinds.end()) {
          const std::string hint = did_you_mean(kind, kKinds);
          throw Error(ErrorCategory::usage, "unknown plugin kind '" + kind + "' under opt: in config file " +
                                                file + (hint.empty() ? "" : "; " + hint) +
                                                " (kinds: scaler, clipper, nan_policy, comm)");
        }
        if (!kind_item.second.IsMap())
          throw Error(ErrorCategory::usage,
                      "opt." + kind + " in config file " + file + " must map option names to values");
        for (const auto& o : kind_item.second)
          cfg.plugin_options_file[kind][o.first.as<std::string>()] = scalar_text(
              o.second, "opt." + kind + "." + o.first.as<std::string>() + " in config file " + file);
      }
      continue;
    }
    if (key == "config" || key == "help" || key == "print-config")
      throw Error(ErrorCategory::usage, where + " is only accepted on the command line");
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::string hint = did_you_mean(key, known);
      throw Error(ErrorCategory::usage, "unknown " + where + (hint.empty() ? "" : "; " + hint));
    }
    if (item.second.IsSequence()) {
      for (const auto& v : item.second) words.push_back("--" + key + "=" + scalar_text(v, where));
    } else if (key == "allow-untrusted-plugins" || key == "weights-only") {
      const std::string v = scalar_text(item.second, where);
      if (v == "true")
        words.push_back("--" + key);
      else if (v != "false")
        throw Error(ErrorCategory::usage, where + " must be true or false, got '" + v + "'");
    } else {
      words.push_back("--" + key + "=" + scalar_text(item.second, where));
    }
  }
  return words;
}

template <class T>
std::string text_of(const boost::any& v) {
  std::ostringstream s;
  s << boost::any_cast<T>(v);
  return s.str();
}

std::string value_text(const po::variable_value& v) {
  const boost::any& a = v.value();
  if (a.type() == typeid(std::string)) return boost::any_cast<std::string>(a);
  if (a.type() == typeid(int64_t)) return text_of<int64_t>(a);
  if (a.type() == typeid(int)) return text_of<int>(a);
  if (a.type() == typeid(uint64_t)) return text_of<uint64_t>(a);
  if (a.type() == typeid(double)) return text_of<double>(a);
  if (a.type() == typeid(bool)) return boost::any_cast<bool>(a) ? "true" : "false";
  if (a.type() == typeid(std::vector<std::string>)) {
    std::string out;
    for (const auto& s : boost::any_cast<std::vector<std::string>>(a)) out += (out.empty() ? "" : " ") + s;
    return out;
  }
  return "?";
}

// The first set variable of a list, with its name.
std::optional<std::pair<std::string, std::string>> first_env(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v != nullptr && *v != '\0')
      return std::make_pair(std::string(n), std::string(v));
  return std::nullopt;
}

// "node[01-04,07],gpu3" -> "node01": the first host of a SLURM node list (rank 0's host).
std::string first_slurm_host(const std::string& list) {
  std::string host;
  size_t i = 0;
  while (i < list.size() && list[i] != ',' && list[i] != '[') host += list[i++];
  if (i < list.size() && list[i] == '[') {
    ++i;
    while (i < list.size() && list[i] != '-' && list[i] != ',' && list[i] != ']') host += list[i++];
  }
  return host;
}

// What the launchers say about a distributed option: torchrun's variables first, then SLURM's,
// then Open MPI's. Returns value and "environment (VAR)".
std::optional<std::pair<std::string, std::string>> distributed_env(const std::string& option) {
  std::optional<std::pair<std::string, std::string>> hit;
  if (option == "world-size")
    hit = first_env({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"});
  else if (option == "rank")
    hit = first_env({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"});
  else if (option == "local-rank")
    hit = first_env({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"});
  else if (option == "node-rank")
    hit = first_env({"GROUP_RANK", "SLURM_NODEID"});
  else if (option == "nnodes")
    hit = first_env({"SLURM_NNODES"});
  else if (option == "nproc-per-node") {
    hit = first_env({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"});
    if (hit && hit->first == "SLURM_NTASKS_PER_NODE")  // "2(x3)" means 2 on each of 3 nodes
      hit->second = hit->second.substr(0, hit->second.find('('));
  } else if (option == "master-addr") {
    hit = first_env({"MASTER_ADDR"});
    if (!hit)
      if (auto list = first_env({"SLURM_JOB_NODELIST", "SLURM_NODELIST"}))
        hit = std::make_pair(list->first, first_slurm_host(list->second));
  } else if (option == "master-port")
    hit = first_env({"MASTER_PORT"});
  if (hit) return std::make_pair(hit->second, "environment (" + hit->first + ")");
  return std::nullopt;
}

int parse_int_setting(const std::string& name, const std::string& value, const std::string& source) {
  try {
    size_t used = 0;
    const long v = std::stol(value, &used);
    if (used == value.size() && v >= INT32_MIN && v <= INT32_MAX) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  throw Error(ErrorCategory::usage, "--" + name + " must be an integer, got '" + value + "' from " + source);
}

bool mentions(const po::parsed_options& parsed, const std::string& name) {
  for (const auto& o : parsed.options)
    if (o.string_key == name) return true;
  return false;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ErrorCategory::usage, message);
}

}  // namespace

std::string train_options_help() {
  std::ostringstream s;
  s << "usage: ampkit-train [options]\n\n" << host_options();
  s << "\nEnvironment: AMPKIT_PLUGIN_PATH (plugin folders, colon-separated), AMPKIT_<KIND>_<OPTION> (plugin "
       "options).\n"
       "Distributed: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, "
       "MASTER_PORT; "
       "SLURM_PROCID/NTASKS/LOCALID/NODEID/NNODES/NTASKS_PER_NODE/JOB_NODELIST; "
       "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/"
       "LOCAL_SIZE (override the config file; the command line overrides them).\n";
  return s.str();
}

void validate(const DistributedConfig& d, bool cuda_available) {
  const std::string backend = std::filesystem::path(d.backend).stem().string();
  auto is = [&](const std::string& name) { return backend == name || backend == "libampkit-comm-" + name; };
  require(d.world_size >= 1, "world size must be >= 1, got " + std::to_string(d.world_size));
  require(d.rank >= 0 && d.rank < d.world_size, "rank " + std::to_string(d.rank) + " is outside world size " +
                                                    std::to_string(d.world_size) + " (ranks are 0.." +
                                                    std::to_string(d.world_size - 1) + ")");
  require(d.master_port >= 1 && d.master_port <= 65535,
          "master port must be in 1..65535, got " + std::to_string(d.master_port));
  require(!d.master_addr.empty(), "master address is empty (set --master-addr or MASTER_ADDR)");
  require(d.nnodes >= 1, "nnodes must be >= 1, got " + std::to_string(d.nnodes));
  require(d.nproc_per_node >= 1, "nproc-per-node must be >= 1, got " + std::to_string(d.nproc_per_node));
  require(d.node_rank >= 0 && d.node_rank < d.nnodes,
          "node rank " + std::to_string(d.node_rank) + " is outside nnodes " + std::to_string(d.nnodes));
  require(d.nnodes * d.nproc_per_node == d.world_size,
          "inconsistent node counts: nnodes " + std::to_string(d.nnodes) + " x nproc-per-node " +
              std::to_string(d.nproc_per_node) + " != world size " + std::to_string(d.world_size));
  require(d.local_rank >= 0 && d.local_rank < d.nproc_per_node, "local rank " + std::to_string(d.local_rank) +
                                                                    " is outside nproc-per-node " +
                                                                    std::to_string(d.nproc_per_node));
  require(std::isfinite(d.bucket_cap_mb) && d.bucket_cap_mb > 0 && d.bucket_cap_mb <= 65536,
          "bucket-cap-mb must be in (0, 65536], got " + std::to_string(d.bucket_cap_mb));
  require(std::isfinite(d.timeout_seconds) && d.timeout_seconds >= 1,
          "dist-timeout must be >= 1 second, got " + std::to_string(d.timeout_seconds));
  for (int id : d.device_ids) require(id >= 0, "device ids must be >= 0, got " + std::to_string(id));
  require(!(is("local") && d.world_size > 1), "comm 'local' runs one process but the world size is " +
                                                  std::to_string(d.world_size) + "; use --comm gloo or nccl");
  require(!(is("nccl") && !cuda_available),
          "comm 'nccl' needs CUDA and no CUDA device is visible; use --comm gloo (CPU) instead");
}

TrainConfig parse_train_config(int argc, const char* const argv[]) {
  TrainConfig cfg;
  const po::options_description options = host_options();
  po::variables_map vm;
  po::parsed_options cli(&options), file(&options);
  try {
    cli = po::command_line_parser(argc, argv).options(options).run();
    po::store(cli, vm);
    if (vm.count("config")) {
      cfg.config_file = vm["config"].as<std::string>();
      const auto words = read_yaml(cfg.config_file, cfg);
      file = po::command_line_parser(words).options(options).run();
      po::store(file, vm);
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name.front() == '-') name.erase(0, 1);
    const std::string hint = did_you_mean(name, option_names(options));
    throw Error(ErrorCategory::usage,
                std::string(e.what()) + (hint.empty() ? "" : "; " + hint) + " (see ampkit-train --help)");
  } catch (const po::error& e) {
    throw Error(ErrorCategory::usage, std::string(e.what()) + " (see ampkit-train --help)");
  }

  cfg.help = vm.count("help") > 0;
  cfg.print_config = vm["print-config"].as<bool>();
  const std::string file_source = "config file " + cfg.config_file;
  for (const auto& opt : options.options()) {
    const std::string name = opt->long_name();
    if (name == "help" || name == "print-config" || name == "opt" || !vm.count(name)) continue;
    const std::string source = mentions(cli, name)    ? "command line"
                               : mentions(file, name) ? file_source
                                                      : "default";
    cfg.settings.push_back({name, value_text(vm[name]), source});
  }

  // Distributed layout: the launchers' environment overrides the config file and defaults.
  for (auto& setting : cfg.settings) {
    if (setting.source == "command line") continue;
    if (auto env = distributed_env(setting.name)) {
      setting.value = env->first;
      setting.source = env->second;
    }
  }
  auto setting_of = [&](const std::string& name) -> TrainConfig::Setting& {
    for (auto& s : cfg.settings)
      if (s.name == name) return s;
    throw Error(ErrorCategory::internal, "no setting " + name);
  };
  auto int_setting = [&](const std::string& name) {
    const auto& s = setting_of(name);
    return parse_int_setting(name, s.value, s.source);
  };
  DistributedConfig& dist = cfg.dist;
  dist.world_size = int_setting("world-size");
  dist.rank = int_setting("rank");
  dist.local_rank = int_setting("local-rank");
  dist.nnodes = int_setting("nnodes");
  dist.node_rank = int_setting("node-rank");
  dist.master_addr = setting_of("master-addr").value;
  dist.master_port = int_setting("master-port");
  if (setting_of("nproc-per-node").source == "default" && dist.nnodes >= 1 &&
      dist.world_size % dist.nnodes == 0) {
    dist.nproc_per_node = dist.world_size / dist.nnodes;
    setting_of("nproc-per-node").value = std::to_string(dist.nproc_per_node);
    setting_of("nproc-per-node").source = "default (world size / nnodes)";
  } else {
    dist.nproc_per_node = int_setting("nproc-per-node");
  }
  if (setting_of("nnodes").source == "default" &&
      setting_of("nproc-per-node").source != "default (world size / nnodes)" && dist.nproc_per_node >= 1 &&
      dist.world_size % dist.nproc_per_node == 0) {
    dist.nnodes = dist.world_size / dist.nproc_per_node;  // torchrun: WORLD_SIZE / LOCAL_WORLD_SIZE
    setting_of("nnodes").value = std::to_string(dist.nnodes);
    setting_of("nnodes").source = "default (world size / nproc-per-node)";
  }
  dist.store = vm["rendezvous"].as<std::string>();
  require(dist.store == "tcp" || (dist.store.rfind("file:", 0) == 0 && dist.store.size() > 5),
          "--rendezvous must be tcp or file:PATH, got '" + dist.store + "'");
  const std::string device_ids = vm["device-ids"].as<std::string>();
  for (size_t at = 0; at < device_ids.size();) {
    const size_t comma = std::min(device_ids.find(',', at), device_ids.size());
    dist.device_ids.push_back(
        parse_int_setting("device-ids", device_ids.substr(at, comma - at), "--device-ids"));
    at = comma + 1;
  }
  dist.bucket_cap_mb = vm["bucket-cap-mb"].as<double>();
  dist.find_unused_parameters = vm["find-unused-parameters"].as<bool>();
  dist.broadcast_buffers = vm["broadcast-buffers"].as<bool>();
  dist.gradient_as_bucket_view = vm["gradient-as-bucket-view"].as<bool>();
  dist.timeout_seconds = vm["dist-timeout"].as<double>();

  cfg.workload = vm["workload"].as<std::string>();
  require(cfg.workload == "fashion-mnist" || cfg.workload == "char-gpt" || cfg.workload == "synthetic",
          "--workload must be fashion-mnist, char-gpt or synthetic, got '" + cfg.workload + "'");
  const std::string precision = vm["precision"].as<std::string>();
  if (precision == "fp32")
    cfg.precision = Precision::fp32;
  else if (precision == "bf16")
    cfg.precision = Precision::bf16;
  else if (precision == "fp16")
    cfg.precision = Precision::fp16;
  else
    throw Error(ErrorCategory::usage, "--precision must be fp32, bf16 or fp16, got '" + precision + "'");
  require(!(vm.count("epochs") && vm.count("steps")), "give --epochs or --steps, not both");
  if (vm.count("epochs")) cfg.epochs = vm["epochs"].as<int64_t>();
  if (vm.count("steps")) cfg.steps = vm["steps"].as<int64_t>();
  if (!vm.count("epochs") && !vm.count("steps")) {
    cfg.epochs = 1;
    cfg.settings.push_back({"epochs", "1", "default"});
  }
  require(vm.count("steps") ? cfg.steps >= 1 : cfg.epochs >= 1, "--epochs and --steps must be >= 1");
  cfg.batch_size = vm["batch-size"].as<int64_t>();
  require(cfg.batch_size >= 1 && cfg.batch_size <= (1 << 20),
          "--batch-size must be in [1, 1048576], got " + std::to_string(cfg.batch_size));
  cfg.accumulate = vm["accumulate"].as<int>();
  require(cfg.accumulate >= 1 && cfg.accumulate <= 4096,
          "--accumulate must be in [1, 4096], got " + std::to_string(cfg.accumulate));
  cfg.lr = vm["lr"].as<double>();
  require(std::isfinite(cfg.lr) && cfg.lr > 0, "--lr must be a finite number > 0");
  cfg.seed = vm["seed"].as<uint64_t>();
  cfg.optimizer = vm["optimizer"].as<std::string>();
  require(cfg.optimizer == "adamw" || cfg.optimizer == "sgd",
          "--optimizer must be adamw or sgd, got '" + cfg.optimizer + "'");
  cfg.weight_decay = vm["weight-decay"].as<double>();
  require(std::isfinite(cfg.weight_decay) && cfg.weight_decay >= 0, "--weight-decay must be >= 0");
  cfg.lr_schedule = vm["lr-schedule"].as<std::string>();
  require(cfg.lr_schedule == "constant" || cfg.lr_schedule == "cosine",
          "--lr-schedule must be constant or cosine, got '" + cfg.lr_schedule + "'");
  cfg.warmup_steps = vm["warmup-steps"].as<int64_t>();
  require(cfg.warmup_steps >= 0, "--warmup-steps must be >= 0");
  cfg.device = vm["device"].as<std::string>();
  require(cfg.device == "cpu" || cfg.device == "cuda",
          "--device must be cpu or cuda, got '" + cfg.device + "'");
  cfg.threads = vm["threads"].as<int>();
  require(cfg.threads >= 0 && cfg.threads <= 1024, "--threads must be in [0, 1024]");

  cfg.plugins["scaler"] = vm["scaler"].as<std::string>();
  cfg.plugins["clipper"] = vm["clipper"].as<std::string>();
  cfg.plugins["nan_policy"] = vm["nan-policy"].as<std::string>();
  cfg.plugins["comm"] = vm["comm"].as<std::string>();
  if (dist.world_size > 1 && setting_of("comm").source == "default") {
    // More than one process and no --comm: the backend torch.distributed would pick.
    cfg.plugins["comm"] = cfg.device == "cuda" ? "nccl" : "gloo";
    setting_of("comm").value = cfg.plugins["comm"];
    setting_of("comm").source =
        "default (world size " + std::to_string(dist.world_size) + " on " + cfg.device + ")";
  }
  dist.backend = cfg.plugins["comm"];
  if (vm.count("opt")) {
    for (const auto& item : vm["opt"].as<std::vector<std::string>>()) {
      const auto dot = item.find('.'), eq = item.find('=');
      require(dot != std::string::npos && eq != std::string::npos && dot < eq && dot > 0 && eq > dot + 1,
              "--opt must be KIND.OPTION=VALUE (e.g. scaler.scale=512), got '" + item + "'");
      const std::string kind = item.substr(0, dot);
      if (std::find(kKinds.begin(), kKinds.end(), kind) == kKinds.end()) {
        const std::string hint = did_you_mean(kind, kKinds);
        throw Error(ErrorCategory::usage, "--opt " + item + ": unknown plugin kind '" + kind + "'" +
                                              (hint.empty() ? "" : "; " + hint) +
                                              " (kinds: scaler, clipper, nan_policy, comm)");
      }
      // From a config file, --opt words would arrive here too; they are command line only.
      cfg.plugin_options_cli[kind][item.substr(dot + 1, eq - dot - 1)] = item.substr(eq + 1);
    }
  }
  if (vm.count("plugin-dir")) cfg.plugin_dirs = vm["plugin-dir"].as<std::vector<std::string>>();
  cfg.allow_untrusted_plugins = vm["allow-untrusted-plugins"].as<bool>();
  cfg.metrics_file = vm["metrics"].as<std::string>();
  cfg.summary_file = vm["summary"].as<std::string>();
  cfg.layer_norms_top_k = vm["layer-norms-top-k"].as<int64_t>();
  require(cfg.layer_norms_top_k >= 0 && cfg.layer_norms_top_k <= 1000000,
          "--layer-norms-top-k must be in [0, 1000000], got " + std::to_string(cfg.layer_norms_top_k));
  cfg.layer_norms_file = vm["layer-norms"].as<std::string>();
  cfg.data_dir = vm["data-dir"].as<std::string>();
  cfg.eval_batches = vm["eval-batches"].as<int64_t>();
  require(cfg.eval_batches >= 0, "--eval-batches must be >= 0");
  cfg.synthetic_width = vm["synthetic-width"].as<int64_t>();
  cfg.synthetic_depth = vm["synthetic-depth"].as<int64_t>();
  cfg.synthetic_inputs = vm["synthetic-inputs"].as<int64_t>();
  cfg.synthetic_classes = vm["synthetic-classes"].as<int64_t>();
  require(cfg.synthetic_width >= 1 && cfg.synthetic_width <= 65536,
          "--synthetic-width must be in [1, 65536]");
  require(cfg.synthetic_depth >= 0 && cfg.synthetic_depth <= 256, "--synthetic-depth must be in [0, 256]");
  require(cfg.synthetic_inputs >= 1 && cfg.synthetic_inputs <= 65536,
          "--synthetic-inputs must be in [1, 65536]");
  require(cfg.synthetic_classes >= 2 && cfg.synthetic_classes <= 65536,
          "--synthetic-classes must be in [2, 65536]");
  cfg.text_dir = vm["text-dir"].as<std::string>();
  cfg.gpt_layers = vm["gpt-layers"].as<int64_t>();
  cfg.gpt_width = vm["gpt-width"].as<int64_t>();
  cfg.gpt_heads = vm["gpt-heads"].as<int64_t>();
  cfg.gpt_context = vm["gpt-context"].as<int64_t>();
  require(cfg.gpt_layers >= 1 && cfg.gpt_layers <= 64, "--gpt-layers must be in [1, 64]");
  require(cfg.gpt_heads >= 1 && cfg.gpt_heads <= 64, "--gpt-heads must be in [1, 64]");
  require(
      cfg.gpt_width >= cfg.gpt_heads && cfg.gpt_width <= 8192 && cfg.gpt_width % cfg.gpt_heads == 0,
      "--gpt-width must be a multiple of --gpt-heads in [heads, 8192], got " + std::to_string(cfg.gpt_width));
  require(cfg.gpt_context >= 2 && cfg.gpt_context <= 4096, "--gpt-context must be in [2, 4096]");
  cfg.checkpoint_dir = vm["checkpoint-dir"].as<std::string>();
  cfg.checkpoint_every = vm["checkpoint-every"].as<int64_t>();
  require(cfg.checkpoint_every >= 0, "--checkpoint-every must be >= 0");
  cfg.keep_checkpoints = vm["keep-checkpoints"].as<int>();
  require(cfg.keep_checkpoints >= 1,
          "--keep-checkpoints must be >= 1, got " + std::to_string(cfg.keep_checkpoints));
  cfg.resume = vm["resume"].as<std::string>();
  require(cfg.resume != "auto" || !cfg.checkpoint_dir.empty(), "--resume auto needs --checkpoint-dir");
  cfg.weights_only = vm["weights-only"].as<bool>();
  require(!cfg.weights_only || !cfg.resume.empty(), "--weights-only needs --resume");
  if (vm.count("inject")) {
    cfg.inject = vm["inject"].as<std::vector<std::string>>();
    for (const auto& spec : cfg.inject) parse_fault(spec);  // throws with the spec's problem
  }
  cfg.nan_locate = vm["nan-locate"].as<int64_t>();
  require(cfg.nan_locate >= 0, "--nan-locate must be >= 0, got " + std::to_string(cfg.nan_locate));
  cfg.nan_report_dir = vm["nan-report-dir"].as<std::string>();
  cfg.progress = vm["progress"].as<std::string>();
  require(cfg.progress == "auto" || cfg.progress == "never",
          "--progress must be auto or never, got '" + cfg.progress + "'");
  cfg.log_every = vm["log-every"].as<int64_t>();
  require(cfg.log_every >= 1, "--log-every must be >= 1");
  return cfg;
}

}  // namespace ampkit
