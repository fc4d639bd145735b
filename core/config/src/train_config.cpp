// Command line and YAML parsing for ampkit-train, on Boost.Program_options and yaml-cpp.
#include "ampkit/train_config.h"

#include <yaml-cpp/yaml.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
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
    ("optimizer", po::value<std::string>()->default_value("adamw"), "Optimizer: adamw | sgd (momentum 0.9).")
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
  if (!n.IsScalar()) throw Error(ExitCode::usage, where + " must be a single value");
  return n.as<std::string>();
}

// Turns the YAML file into command-line words so one parser validates both sources.
std::vector<std::string> read_yaml(const std::string& file, TrainConfig& cfg) {
  if (!std::filesystem::exists(file)) throw Error(ExitCode::usage, "config file " + file + " does not exist");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    throw Error(ExitCode::usage, "config file " + file + " is not valid YAML: " + e.what());
  }
  if (root.IsNull()) return {};
  if (!root.IsMap())
    throw Error(ExitCode::usage, "config file " + file + " must be a mapping of option: value");
  const auto known = option_names(host_options());
  std::vector<std::string> words;
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string where = "key '" + key + "' in config file " + file;
    if (key == "opt") {
      if (!item.second.IsMap())
        throw Error(ExitCode::usage,
                    where + " must map plugin kinds to options, e.g. opt: {scaler: {scale: 512}}");
      for (const auto& kind_item : item.second) {
        const std::string kind = kind_item.first.as<std::string>();
        if (std::find(kKinds.begin(), kKinds.end(), kind) == kKinds.end()) {
          const std::string hint = did_you_mean(kind, kKinds);
          throw Error(ExitCode::usage, "unknown plugin kind '" + kind + "' under opt: in config file " +
                                           file + (hint.empty() ? "" : "; " + hint) +
                                           " (kinds: scaler, clipper, nan_policy, comm)");
        }
        if (!kind_item.second.IsMap())
          throw Error(ExitCode::usage,
                      "opt." + kind + " in config file " + file + " must map option names to values");
        for (const auto& o : kind_item.second)
          cfg.plugin_options_file[kind][o.first.as<std::string>()] = scalar_text(
              o.second, "opt." + kind + "." + o.first.as<std::string>() + " in config file " + file);
      }
      continue;
    }
    if (key == "config" || key == "help" || key == "print-config")
      throw Error(ExitCode::usage, where + " is only accepted on the command line");
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::string hint = did_you_mean(key, known);
      throw Error(ExitCode::usage, "unknown " + where + (hint.empty() ? "" : "; " + hint));
    }
    if (item.second.IsSequence()) {
      for (const auto& v : item.second) words.push_back("--" + key + "=" + scalar_text(v, where));
    } else if (key == "allow-untrusted-plugins" || key == "weights-only") {
      const std::string v = scalar_text(item.second, where);
      if (v == "true")
        words.push_back("--" + key);
      else if (v != "false")
        throw Error(ExitCode::usage, where + " must be true or false, got '" + v + "'");
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

bool mentions(const po::parsed_options& parsed, const std::string& name) {
  for (const auto& o : parsed.options)
    if (o.string_key == name) return true;
  return false;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ExitCode::usage, message);
}

}  // namespace

std::string train_options_help() {
  std::ostringstream s;
  s << "usage: ampkit-train [options]\n\n" << host_options();
  s << "\nEnvironment: AMPKIT_PLUGIN_PATH (plugin folders, colon-separated), AMPKIT_<KIND>_<OPTION> (plugin "
       "options).\n"
       "Exit codes: 0 ok, 1 internal error, 2 usage, 3 plugin, 4 data, 5 NaN abort, 6 checkpoint, 130 "
       "interrupted/preempted "
       "(docs/configuration.md).\n";
  return s.str();
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
    throw Error(ExitCode::usage,
                std::string(e.what()) + (hint.empty() ? "" : "; " + hint) + " (see ampkit-train --help)");
  } catch (const po::error& e) {
    throw Error(ExitCode::usage, std::string(e.what()) + " (see ampkit-train --help)");
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
    throw Error(ExitCode::usage, "--precision must be fp32, bf16 or fp16, got '" + precision + "'");
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
  if (vm.count("opt")) {
    for (const auto& item : vm["opt"].as<std::vector<std::string>>()) {
      const auto dot = item.find('.'), eq = item.find('=');
      require(dot != std::string::npos && eq != std::string::npos && dot < eq && dot > 0 && eq > dot + 1,
              "--opt must be KIND.OPTION=VALUE (e.g. scaler.scale=512), got '" + item + "'");
      const std::string kind = item.substr(0, dot);
      if (std::find(kKinds.begin(), kKinds.end(), kind) == kKinds.end()) {
        const std::string hint = did_you_mean(kind, kKinds);
        throw Error(ExitCode::usage, "--opt " + item + ": unknown plugin kind '" + kind + "'" +
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
