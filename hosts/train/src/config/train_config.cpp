// ampkit-train's configuration: the option table (option_table.cpp) read from the command line,
// the YAML file and the launchers' environment, on Boost.Program_options and yaml-cpp.
#include "config/train_config.h"

#include <ampkit/kinds.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "ampkit/error.h"
#include "ampkit/utf8.h"
#include "config/config_file.h"
#include "config/option_table.h"
#include "config/workload_options.h"

namespace po = boost::program_options;

namespace ampkit {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ErrorCategory::usage, message);
}

// The help column shows the default as Program_options always printed it (a boolean as 0/1) and
// the range, where there is one, after the help sentence.
// One options_description per group, in the table's order: ampkit-train's own options, then each
// workload's.
void add_option(po::options_description& o, const HostOption& opt) {
  const std::string name = opt.short_name ? opt.name + "," + opt.short_name : opt.name;
  const std::string range = range_text(opt);
  const std::string help = opt.help + (range.empty() ? "" : " Range: " + range + ".");
  if (opt.type == OptionType::flag) {
    o.add_options()(name.c_str(), po::bool_switch(), help.c_str());
  } else if (opt.type == OptionType::list) {
    o.add_options()(name.c_str(), po::value<std::vector<std::string>>()->composing(), help.c_str());
  } else if (opt.default_value) {
    const std::string& d = *opt.default_value;
    const std::string shown = opt.type != OptionType::boolean ? d : d == "true" ? "1" : "0";
    o.add_options()(name.c_str(), po::value<std::string>()->default_value(d, shown), help.c_str());
  } else {
    o.add_options()(name.c_str(), po::value<std::string>(), help.c_str());
  }
}

po::options_description program_options() {
  po::options_description all("ampkit-train options");
  std::vector<std::string> groups;
  for (const HostOption& opt : host_option_table()) {
    if (opt.group.empty())
      add_option(all, opt);
    else if (std::find(groups.begin(), groups.end(), opt.group) == groups.end())
      groups.push_back(opt.group);
  }
  for (const std::string& group : groups) {
    po::options_description o(group + " options");
    for (const HostOption& opt : host_option_table())
      if (opt.group == group) add_option(o, opt);
    all.add(o);
  }
  return all;
}

bool mentions(const po::parsed_options& parsed, const std::string& name) {
  for (const auto& o : parsed.options)
    if (o.string_key == name) return true;
  return false;
}

struct ParsedSources {
  po::variables_map vm;
  po::parsed_options cli{nullptr}, file{nullptr};
};

// Boost.Program_options' error messages substitute placeholders ("%value%", ...) until none is
// left, so a word holding one makes what() loop forever (found by fuzz_train_config).
void refuse_placeholders(const std::vector<std::string>& words) {
  for (const auto& w : words)
    for (const char* placeholder :
         {"%canonical_option%", "%option%", "%value%", "%prefix%", "%original_token%"})
      if (w.find(placeholder) != std::string::npos)
        throw Error(ErrorCategory::usage,
                    "argument '" + w + "' contains '" + placeholder +
                        "', which ampkit-train does not accept (see ampkit-train --help)");
}

// The command line, then the config file it names: Program_options keeps the first source of each.
ParsedSources parse_sources(int argc, const char* const argv[], TrainConfig& cfg) {
  static const po::options_description options = program_options();
  ParsedSources p;
  refuse_placeholders(std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
  try {
    p.cli = po::command_line_parser(argc, argv).options(options).run();
    for (const auto& o : p.cli.options)
      if (o.position_key >= 0 && !o.value.empty())
        throw Error(ErrorCategory::usage,
                    "unexpected argument '" + o.value.front() +
                        "': ampkit-train takes only --options (see ampkit-train --help)");
    po::store(p.cli, p.vm);
    if (p.vm.count("config")) {
      cfg.config_file = p.vm["config"].as<std::string>();
      const std::vector<std::string> words = config_file_words(cfg.config_file, cfg);
      refuse_placeholders(words);
      p.file = po::command_line_parser(words).options(options).run();
      po::store(p.file, p.vm);
    }
    po::notify(p.vm);
  } catch (const po::unknown_option& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name.front() == '-') name.erase(0, 1);
    const std::string hint = did_you_mean(name, option_names());
    throw Error(ErrorCategory::usage,
                std::string(e.what()) + (hint.empty() ? "" : "; " + hint) + " (see ampkit-train --help)");
  } catch (const po::error& e) {
    throw Error(ErrorCategory::usage, std::string(e.what()) + " (see ampkit-train --help)");
  }
  return p;
}

// One option's text and where it came from: command line > launcher environment > config file >
// default. Lists and flags come from Program_options' own types.
std::optional<TrainConfig::Setting> setting_of(const HostOption& o, const ParsedSources& p,
                                               const std::string& file_source) {
  const bool given = mentions(p.cli, o.name);
  TrainConfig::Setting s{o.name, "",
                         given                      ? "command line"
                         : mentions(p.file, o.name) ? file_source
                                                    : "default"};
  if (!given)
    if (auto env = launcher_value(o, [](const char* n) { return std::getenv(n); })) {
      s.value = env->first;
      s.source = env->second;
      return s;
    }
  if (!p.vm.count(o.name)) return std::nullopt;
  const boost::any& a = p.vm[o.name].value();
  if (o.type == OptionType::flag)
    s.value = boost::any_cast<bool>(a) ? "true" : "false";
  else if (o.type != OptionType::list)
    s.value = boost::any_cast<std::string>(a);
  return s;
}

HostOptionValue value_of(const HostOption& o, const TrainConfig::Setting& s, const ParsedSources& p) {
  if (o.type != OptionType::list) return parse_option_value(o, s.value, s.source);
  HostOptionValue v;
  v.list = p.vm[o.name].as<std::vector<std::string>>();
  return v;
}

// Every option of the table into its field, with the setting --print-config shows.
void apply_table(const ParsedSources& p, TrainConfig& cfg) {
  const std::string file_source = "config file " + cfg.config_file;
  for (const HostOption& o : host_option_table()) {
    std::optional<TrainConfig::Setting> s = setting_of(o, p, file_source);
    if (!s) continue;
    const HostOptionValue v = value_of(o, *s, p);
    s->value = canonical_text(o, v);
    if (o.store) o.store(cfg, v);
    if (o.listed) cfg.settings.push_back(*s);
  }
}

// Every value ends up in JSON (summary, checkpoint manifest), which holds only UTF-8: refuse
// other bytes now, with the option's name, rather than after training.
void check_utf8(const TrainConfig& cfg) {
  auto check = [](const std::string& what, const std::string& text) {
    if (const auto at = invalid_utf8_at(text))
      throw Error(ErrorCategory::usage,
                  what + " is not valid UTF-8 (byte " + std::to_string(*at) + "); give UTF-8 text or paths");
  };
  for (const auto& s : cfg.settings) check("--" + s.name, s.value);
  for (const auto* source : {&cfg.plugin_options_cli, &cfg.plugin_options_file})
    for (const auto& [kind, options] : *source)
      for (const auto& [name, value] : options) check("option " + kind + "." + name, value);
  for (const auto& dir : cfg.plugin_dirs) check("--plugin-dir", dir);
  for (const auto& spec : cfg.inject) check("--inject", spec);
}

// --epochs and --steps together are one setting, the run's length: when the command line gives
// one and the config file the other, the command line's wins as it does for every option.
void choose_run_length(TrainConfig& cfg, const ParsedSources& p) {
  auto drop = [&](const char* name, int64_t& field) {
    field = 0;
    cfg.settings.erase(std::remove_if(cfg.settings.begin(), cfg.settings.end(),
                                      [&](const TrainConfig::Setting& s) { return s.name == name; }),
                       cfg.settings.end());
  };
  if (mentions(p.cli, "steps") && !mentions(p.cli, "epochs") && mentions(p.file, "epochs"))
    drop("epochs", cfg.epochs);
  if (mentions(p.cli, "epochs") && !mentions(p.cli, "steps") && mentions(p.file, "steps"))
    drop("steps", cfg.steps);
}

TrainConfig::Setting& setting(TrainConfig& cfg, const std::string& name) {
  for (auto& s : cfg.settings)
    if (s.name == name) return s;
  throw Error(ErrorCategory::internal, "no setting " + name);
}

// Defaults that follow from other values: node counts as torchrun derives them, and the comm
// backend torch.distributed would pick for more than one process.
void derive_defaults(TrainConfig& cfg) {
  DistributedConfig& d = cfg.dist;
  if (setting(cfg, "nproc-per-node").source == "default" && d.world_size % d.nnodes == 0) {
    d.nproc_per_node = d.world_size / d.nnodes;
    setting(cfg, "nproc-per-node") = {"nproc-per-node", std::to_string(d.nproc_per_node),
                                      "default (world size / nnodes)"};
  } else if (setting(cfg, "nnodes").source == "default" && d.world_size % d.nproc_per_node == 0) {
    d.nnodes = d.world_size / d.nproc_per_node;  // torchrun: WORLD_SIZE / LOCAL_WORLD_SIZE
    setting(cfg, "nnodes") = {"nnodes", std::to_string(d.nnodes), "default (world size / nproc-per-node)"};
  }
  if (d.world_size > 1 && setting(cfg, "comm").source == "default") {
    cfg.plugins["comm"] = cfg.device == "cuda" ? "nccl" : "gloo";
    setting(cfg, "comm") = {
        "comm", cfg.plugins["comm"],
        "default (world size " + std::to_string(d.world_size) + " on " + cfg.device + ")"};
  }
  d.backend = cfg.plugins["comm"];
  // fp16 needs a loss scale (its gradients underflow below 6e-8): fp16 defaults to the dynamic
  // scaler, as torch.amp, Lightning's 16-mixed, Accelerate and DeepSpeed do; others need none.
  if (cfg.precision == Precision::fp16 && setting(cfg, "scaler").source == "default") {
    cfg.plugins["scaler"] = "dynamic";
    setting(cfg, "scaler") = {"scaler", "dynamic", "default for fp16"};
  }
  // A restarted job (torchrun, ampkit-launch --max-restarts) continues from its newest checkpoint.
  if (cfg.restart_count > 0 && cfg.resume.empty() && !cfg.checkpoint_dir.empty()) {
    cfg.resume = "auto";
    setting(cfg, "resume") = {"resume", "auto",
                              "default (restart " + std::to_string(cfg.restart_count) + ")"};
  }
  if (cfg.epochs == 0 && cfg.steps == 0) {
    cfg.epochs = 1;
    cfg.settings.push_back({"epochs", "1", "default"});
  }
}

// What no single option can check: values that must agree with each other.
void check_combinations(const TrainConfig& cfg, const ParsedSources& p) {
  require(!(mentions(p.cli, "epochs") && mentions(p.cli, "steps")) &&
              !(mentions(p.file, "epochs") && mentions(p.file, "steps")),
          "give --epochs or --steps, not both");
  // torchrun (and ampkit-launch) number ranks node by node; when all four come from its variables
  // they must agree, or the job would fail later, at the rendezvous, with a less clear message.
  auto from = [&](const char* name) -> std::string {
    for (const auto& s : cfg.settings)
      if (s.name == name) return s.source;
    return "";
  };
  const DistributedConfig& d = cfg.dist;
  if (from("rank") == "environment (RANK)" && from("local-rank") == "environment (LOCAL_RANK)" &&
      from("node-rank") == "environment (GROUP_RANK)" &&
      from("nproc-per-node") == "environment (LOCAL_WORLD_SIZE)")
    require(d.rank == d.node_rank * d.nproc_per_node + d.local_rank,
            "inconsistent launcher environment: RANK=" + std::to_string(d.rank) + " but GROUP_RANK=" +
                std::to_string(d.node_rank) + " x LOCAL_WORLD_SIZE=" + std::to_string(d.nproc_per_node) +
                " + LOCAL_RANK=" + std::to_string(d.local_rank) + " is " +
                std::to_string(d.node_rank * d.nproc_per_node + d.local_rank));
  // Output files are replaced by rename: a folder, a device or a FIFO there would be lost (or
  // the run would fail only at its end). Checked before anything trains.
  for (const auto& [option, path] :
       {std::pair<const char*, const std::string&>{"--metrics", cfg.metrics_file},
        {"--summary", cfg.summary_file},
        {"--layer-norms", cfg.layer_norms_file}}) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    require(
        path.empty() || ec || !std::filesystem::exists(status) || std::filesystem::is_regular_file(status),
        std::string(option) + " " + path + " exists and is not a regular file; give a file path");
  }
  {
    std::error_code ec;
    require(cfg.tensorboard_dir.empty() || !std::filesystem::exists(cfg.tensorboard_dir, ec) ||
                std::filesystem::is_directory(cfg.tensorboard_dir, ec),
            "--tensorboard " + cfg.tensorboard_dir + " exists and is not a folder; give a folder path");
  }
  for (const WorkloadOptions& w : workload_options())
    if (w.check) w.check(cfg);
  // An fp8 recipe's options without a recipe would be stored and never read.
  const auto fp8 = cfg.plugins.find("fp8_recipe");
  if (fp8 == cfg.plugins.end() || fp8->second.empty())
    for (const auto* given : {&cfg.plugin_options_cli, &cfg.plugin_options_file})
      if (const auto it = given->find("fp8_recipe"); it != given->end() && !it->second.empty())
        require(false, "fp8_recipe." + it->second.begin()->first +
                           " is an fp8 recipe's option, but no recipe is selected: add --fp8 RECIPE");
  require(cfg.resume != "auto" || !cfg.checkpoint_dir.empty(), "--resume auto needs --checkpoint-dir");
  require(!cfg.weights_only || (!cfg.resume.empty() && cfg.resume != "none"),
          "--weights-only needs --resume");
  require(cfg.init_from.empty() || cfg.resume.empty() || cfg.resume == "auto" || cfg.resume == "none",
          "--init-from and --resume PATH exclude each other (--resume auto with --init-from: resume if a "
          "checkpoint exists, else start from the file)");
}

}  // namespace

std::string train_options_help() {
  std::ostringstream s;
  s << "usage: ampkit-train [options]\n\n" << program_options();
  s << "\nEnvironment: AMPKIT_PLUGIN_PATH (plugin folders, colon-separated), AMPKIT_<KIND>_<OPTION> (plugin "
       "options).\n"
       "Launchers (torchrun, then SLURM, then Open MPI; they override the config file, the command line "
       "overrides them):";
  // From the option table's own lists, so this line cannot drift from what is read.
  std::string sep = " ";
  for (const HostOption& o : host_option_table()) {
    if (o.environment.empty()) continue;
    s << sep << "--" << o.name << " <-";
    for (size_t i = 0; i < o.environment.size(); ++i) s << (i == 0 ? " " : "/") << o.environment[i];
    sep = "; ";
  }
  s << ".\n";
  return s.str();
}

// Ranges of single values are the table's; these are the job layout's consistency rules.
void validate(const DistributedConfig& d, const std::string& comm, const CommFacts& facts,
              bool cuda_available) {
  const auto text = [](int v) { return std::to_string(v); };
  require(d.rank < d.world_size, "rank " + text(d.rank) + " is outside world size " + text(d.world_size) +
                                     " (ranks are 0.." + text(d.world_size - 1) + ")");
  require(!d.master_addr.empty(), "master address is empty (set --master-addr or MASTER_ADDR)");
  // No host name or address holds one; a newline would also split this program's one-line errors.
  require(std::none_of(d.master_addr.begin(), d.master_addr.end(),
                       [](unsigned char c) { return c <= ' ' || c == 0x7f; }),
          "master address (--master-addr or MASTER_ADDR) holds a space or a control character; give a host "
          "name or an IP address");
  require(d.node_rank < d.nnodes, "node rank " + text(d.node_rank) + " is outside nnodes " + text(d.nnodes));
  require(d.nnodes * d.nproc_per_node == d.world_size, "inconsistent node counts: nnodes " + text(d.nnodes) +
                                                           " x nproc-per-node " + text(d.nproc_per_node) +
                                                           " != world size " + text(d.world_size));
  require(d.local_rank < d.nproc_per_node,
          "local rank " + text(d.local_rank) + " is outside nproc-per-node " + text(d.nproc_per_node));
  // What the comm plugin declares about itself (comm_backend.h's CommFact), not its name.
  require(facts.multi_process || d.world_size == 1, "comm '" + comm +
                                                        "' runs one process but the world size is " +
                                                        text(d.world_size) + "; use --comm gloo or nccl");
  require(!facts.needs_cuda || cuda_available,
          "comm '" + comm + "' needs CUDA and no CUDA device is visible; use --comm gloo (CPU) instead");
}

TrainConfig parse_train_config(int argc, const char* const argv[]) {
  TrainConfig cfg;
  const ParsedSources p = parse_sources(argc, argv, cfg);
  cfg.help = p.vm["help"].as<bool>();
  cfg.print_config = p.vm["print-config"].as<bool>();
  apply_table(p, cfg);
  check_utf8(cfg);
  choose_run_length(cfg, p);
  derive_defaults(cfg);
  check_combinations(cfg, p);
  return cfg;
}

}  // namespace ampkit
