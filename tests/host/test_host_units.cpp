// ampkit-train's pure functions, tested in-process: the option table and its parser, the
// launchers' environment, fault specs, the NaN locator on a toy model, metrics kept on resume.
#define BOOST_TEST_MODULE host_units
#include <ATen/ATen.h>
#include <ampkit/autocast_guard.h>
#include <ampkit/checkpoint.h>
#include <ampkit/error.h>
#include <ampkit/fault_injection.h>
#include <ampkit/forward_hook.h>
#include <ampkit/kind_flags.h>
#include <ampkit/kinds.h>
#include <ampkit/metrics.h>
#include <ampkit/nan_locator.h>
#include <ampkit/tensorboard.h>
#include <ampkit/utf8.h>
#include <sys/stat.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "config/fault_spec.h"
#include "config/option_table.h"
#include "config/train_config.h"
#include "session/nan_reports.h"
#include "session/precision_checks.h"
#include "session/rank_sync.h"
#include "session/thread_policy.h"
#include "test_paths.h"
#include "workloads/workload.h"

namespace ampkit::test {
namespace {

using train::parse_fault;

namespace fs = std::filesystem;

TrainConfig parse(std::vector<std::string> words) {
  words.insert(words.begin(), "ampkit-train");
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  return parse_train_config(static_cast<int>(argv.size()), argv.data());
}

// The message of the ampkit::Error that `f` throws; "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const TrainConfig::Setting& setting(const TrainConfig& cfg, const std::string& name) {
  for (const auto& s : cfg.settings)
    if (s.name == name) return s;
  throw std::runtime_error("no setting " + name);
}

// Sets environment variables for one scope and removes them after.
struct ScopedEnv {
  std::vector<std::string> names;
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) {
      ::setenv(k.c_str(), v.c_str(), 1);
      names.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
};

EnvironmentLookup lookup(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(option_table)

BOOST_AUTO_TEST_CASE(every_option_is_declared_once_with_help_and_a_valid_default) {
  std::set<std::string> names;
  for (const HostOption& o : host_option_table()) {
    BOOST_TEST_CONTEXT(o.name) {
      BOOST_TEST(names.insert(o.name).second);  // unique
      BOOST_TEST(o.help.size() > 10u);
      BOOST_TEST(o.help.back() == '.');
      if (o.default_value && o.type != OptionType::list)  // the default passes its own checks
        BOOST_CHECK_NO_THROW(parse_option_value(o, *o.default_value, "default"));
      if (o.bounds.min && o.bounds.max) BOOST_TEST(*o.bounds.min <= *o.bounds.max);
    }
  }
  BOOST_TEST(names.size() == 77u);  // every host option; a new one updates the docs and this count
  for (const KindInfo& k : kKinds)  // one selector per kind (--fp8 for the optional one)
    BOOST_TEST(names.count(kind_flag(k)) == 1u, kind_flag(k));
}

// docs/configuration.md's table of host options is written by hand: every option must be in it,
// and a default it shows must be the table's (descriptive defaults such as "1 epoch" aside).
BOOST_AUTO_TEST_CASE(the_configuration_reference_names_every_option_with_its_default) {
  std::ifstream in(std::string(ampkit::test::source_dir()) + "/docs/configuration.md");
  BOOST_REQUIRE(in);
  std::set<std::string> documented;
  std::map<std::string, std::string> defaults;  // rows of one option: name -> default cell
  const std::regex row(R"(^\| `--([a-z0-9-]+)[^`]*`(?: / `--[a-z0-9-]+`)? \| ([^|]*) \|)");
  const std::regex name(R"(--([a-z][a-z0-9-]*)((?:/-[a-z]+)*))");
  for (std::string line; std::getline(in, line);) {
    for (std::sregex_iterator it(line.begin(), line.end(), name), end; it != end; ++it) {
      const std::string first = (*it)[1];
      documented.insert(first);
      const std::string prefix = first.substr(0, first.rfind('-') + 1);  // --gpt-layers/-width
      const std::string rest = (*it)[2];
      for (size_t at = rest.find("/-"); at != std::string::npos; at = rest.find("/-", at + 2))
        documented.insert(prefix + rest.substr(at + 2, rest.find('/', at + 2) - at - 2));
    }
    std::smatch m;
    if (std::regex_search(line, m, row) && line.find("` / `") == std::string::npos &&
        line.find("/-") == std::string::npos)
      defaults[m[1]] = m[2];
  }
  for (const HostOption& o : host_option_table()) {
    BOOST_TEST(documented.count(o.name) == 1u, "--" << o.name << " is missing from docs/configuration.md");
    const auto d = defaults.find(o.name);
    if (d == defaults.end() || !o.default_value || d->second.find(' ') != std::string::npos) continue;
    const std::string doc = d->second == "off" ? "false" : d->second;  // flags read "off" there
    BOOST_TEST(canonical_text(o, parse_option_value(o, doc, "docs")) ==
                   canonical_text(o, parse_option_value(o, *o.default_value, "table")),
               "--" << o.name << ": docs say " << d->second << ", the table " << *o.default_value);
  }
  BOOST_TEST(defaults.size() > 40u);  // the table was read
}

BOOST_AUTO_TEST_CASE(values_are_checked_against_type_range_and_choices) {
  BOOST_TEST(parse_option_value(host_option("batch-size"), "1048576", "command line").integer == 1048576);
  BOOST_TEST(error_of([] { parse_option_value(host_option("batch-size"), "0", "command line"); }) ==
             "--batch-size must be in [1, 1048576], got 0");
  BOOST_TEST(error_of([] { parse_option_value(host_option("batch-size"), "8x", "command line"); }) ==
             "--batch-size must be an integer, got '8x'");
  BOOST_TEST(error_of([] { parse_option_value(host_option("lr"), "0", "config file a.yaml"); }) ==
             "--lr must be > 0, got 0 from config file a.yaml");
  BOOST_TEST(error_of([] { parse_option_value(host_option("lr"), "nan", "command line"); }) ==
             "--lr must be a finite number, got 'nan'");
  BOOST_TEST(error_of([] { parse_option_value(host_option("bucket-cap-mb"), "0", "command line"); }) ==
             "--bucket-cap-mb must be in (0, 65536], got 0");
  BOOST_TEST(parse_option_value(host_option("bucket-cap-mb"), "65536", "command line").number == 65536.0);
  BOOST_TEST(error_of([] { parse_option_value(host_option("precision"), "fp8", "command line"); }) ==
             "--precision must be fp32, bf16 or fp16, got 'fp8'");
  BOOST_TEST(error_of([] { parse_option_value(host_option("seed"), "-1", "command line"); }) ==
             "--seed must be a non-negative integer, got '-1'");
  BOOST_TEST(parse_option_value(host_option("seed"), "18446744073709551615", "x").unsigned_integer ==
             18446744073709551615ull);
  BOOST_TEST(parse_option_value(host_option("broadcast-buffers"), "off", "x").boolean == false);
  BOOST_TEST(error_of([] {
               parse_option_value(host_option("broadcast-buffers"), "maybe", "command line");
             }) == "--broadcast-buffers must be true or false, got 'maybe'");
}

BOOST_AUTO_TEST_CASE(ranges_print_in_their_shortest_form) {
  BOOST_TEST(range_text(host_option("batch-size")) == "[1, 1048576]");
  BOOST_TEST(range_text(host_option("lr")) == "> 0");
  BOOST_TEST(range_text(host_option("eval-batches")) == ">= 0");
  BOOST_TEST(range_text(host_option("bucket-cap-mb")) == "(0, 65536]");
  BOOST_TEST(range_text(host_option("workload")) == "");
  const HostOptionValue lr = parse_option_value(host_option("lr"), "1e-3", "x");
  BOOST_TEST(canonical_text(host_option("lr"), lr) == "0.001");
  const HostOptionValue steps = parse_option_value(host_option("steps"), "007", "x");
  BOOST_TEST(canonical_text(host_option("steps"), steps) == "7");
}

BOOST_AUTO_TEST_CASE(the_parser_fills_every_field_from_the_table_defaults) {
  const TrainConfig cfg = parse({"--workload", "synthetic"});
  BOOST_TEST(cfg.batch_size == 64);
  BOOST_TEST(cfg.accumulate == 1);
  BOOST_TEST(cfg.lr == 1e-3);
  BOOST_TEST(cfg.keep_checkpoints == 3);
  BOOST_TEST(cfg.dist.master_port == 29500);
  BOOST_TEST(cfg.data_parallel.bucket_cap_mb == 25.0);
  BOOST_TEST(cfg.data_parallel.broadcast_buffers == true);
  BOOST_TEST(cfg.epochs == 1);  // neither --epochs nor --steps
  BOOST_TEST(cfg.plugins.at("nan_policy") == "skip");
  BOOST_TEST(cfg.progress == "auto");
  // Every listed option appears in --print-config exactly once.
  for (const HostOption& o : host_option_table())
    if (o.listed && o.default_value) BOOST_TEST(setting(cfg, o.name).source != "", o.name);
  BOOST_TEST(setting(cfg, "workload").source == "command line");
  BOOST_TEST(setting(cfg, "batch-size").source == "default");
}

BOOST_AUTO_TEST_CASE(command_line_beats_environment_beats_config_file_beats_default) {
  const fs::path yaml = fs::temp_directory_path() / ("ampkit-units-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(yaml) << "world-size: 8\nmaster-port: 1234\nbatch-size: 16\nseed: 5\n"
                         "opt:\n  scaler:\n    scale: 4\n";
  const ScopedEnv env({{"WORLD_SIZE", "4"}, {"RANK", "3"}});
  const TrainConfig cfg = parse({"--config", yaml.string(), "--seed", "9", "--comm", "gloo"});
  fs::remove(yaml);
  BOOST_TEST(cfg.seed == 9u);            // command line over the file
  BOOST_TEST(cfg.dist.world_size == 4);  // environment over the file
  BOOST_TEST(setting(cfg, "world-size").source == "environment (WORLD_SIZE)");
  BOOST_TEST(cfg.dist.master_port == 1234);  // the file over the default
  BOOST_TEST(setting(cfg, "master-port").source == "config file " + yaml.string());
  BOOST_TEST(cfg.batch_size == 16);
  BOOST_TEST(cfg.plugin_options_file.at("scaler").at("scale") == "4");
  BOOST_TEST(cfg.dist.nproc_per_node == 4);  // world size / nnodes
  BOOST_TEST(setting(cfg, "nproc-per-node").source == "default (world size / nnodes)");
}

BOOST_AUTO_TEST_CASE(combinations_and_plugin_options_are_checked) {
  BOOST_TEST(error_of([] {
               parse({"--steps", "2", "--epochs", "1"});
             }) == "give --epochs or --steps, not both");
  BOOST_TEST(error_of([] {
               parse({"--gpt-width", "130", "--gpt-heads", "4"});
             }) == "--gpt-width must be a multiple of --gpt-heads (4), got 130");
  BOOST_TEST(error_of([] { parse({"--resume", "auto"}); }) == "--resume auto needs --checkpoint-dir");
  BOOST_TEST(error_of([] {
               parse({"--opt", "scalar.scale=2"});
             }).find("unknown plugin kind 'scalar'; did you mean 'scaler'?") != std::string::npos);
  // An fp8 recipe's options need a recipe (--fp8), or they would be stored and never read.
  BOOST_TEST(error_of([] {
               parse({"--opt", "fp8_recipe.margin=1"});
             }) ==
             "fp8_recipe.margin is an fp8 recipe's option, but no recipe is selected: add --fp8 RECIPE");
  const TrainConfig fp8 = parse({"--fp8", "delayed", "--opt", "fp8_recipe.margin=1"});
  BOOST_TEST(fp8.plugins.at("fp8_recipe") == "delayed");
  BOOST_TEST(fp8.plugin_options_cli.at("fp8_recipe").at("margin") == "1");
  const TrainConfig cfg = parse({"--opt", "clipper.max_norm=2", "--opt", "scaler.scale=8"});
  BOOST_TEST(cfg.plugin_options_cli.at("clipper").at("max_norm") == "2");
  BOOST_TEST(cfg.plugin_options_cli.at("scaler").at("scale") == "8");
  const TrainConfig two = parse({"--world-size", "2", "--rank", "1"});
  BOOST_TEST(two.plugins.at("comm") == "gloo");  // torch.distributed's choice on CPU
}

// A scratch folder for one test, removed after it.
struct Scratch {
  fs::path path = fs::temp_directory_path() / ("ampkit-units-" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(path); }
  ~Scratch() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

// The defects an adversarial run found in the host's configuration, one check each.
BOOST_AUTO_TEST_CASE(adversarial_inputs_get_one_clear_usage_error) {
  const Scratch dir;
  // Stray words were ignored: "... --steps 3 fp16" trained in fp32.
  BOOST_TEST(error_of([] {
               parse({"--steps", "3", "fp16"});
             }) == "unexpected argument 'fp16': ampkit-train takes only --options (see ampkit-train --help)");
  // Numbers that overflowed or wrapped.
  BOOST_TEST(error_of([] { parse({"--epochs", "9223372036854775807"}); }).find("--epochs must be") == 0u);
  BOOST_TEST(error_of([] { parse({"--epochs", "18446744073709552"}); }).find("--epochs must be") == 0u);
  BOOST_TEST(error_of([] { parse({"--seed=-1"}); }).find("--seed must be a non-negative integer") == 0u);
  const std::string negative_seed = dir.file("seed.yaml", "seed: -1\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", negative_seed});
             }).find("--seed must be a non-negative integer") == 0u);
  // A trust override in a file.
  const std::string trust = dir.file("trust.yaml", "allow-untrusted-plugins: true\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", trust});
             }) == "key 'allow-untrusted-plugins' in config file " + trust +
                       " is only accepted on the command line");
  // Every document after the first was ignored.
  const std::string two_docs = dir.file("two.yaml", "steps: 3\n---\nprecision: bf16\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", two_docs});
             }) == "config file " + two_docs +
                       " holds 2 YAML documents; give one (its '---' separators split them)");
  // Found by tools/fuzz.sh (fuzz_train_config): yaml-cpp 0.7's LoadAll never returned on a stray
  // ',' and allocated until the machine ran out of memory.
  for (const char* text : {",--\nstes: 7\n", ","}) {
    const std::string stray = dir.file("stray.yaml", text);
    BOOST_TEST(error_of([&] {
                 parse({"--config", stray});
               }) == "config file " + stray + " is not valid YAML: unexpected character at line 1, column 1");
  }
  // Found by fuzz_train_config: Program_options' messages substitute "%canonical_option%" and the
  // like until none is left, so a word holding one made the error loop forever.
  BOOST_TEST(error_of([] { parse({"--%canonical_option%x"}); }) ==
             "argument '--%canonical_option%x' contains '%canonical_option%', which ampkit-train does not "
             "accept (see ampkit-train --help)");
  // A folder or a FIFO as --config (the FIFO blocked forever).
  BOOST_TEST(error_of([&] {
               parse({"--config", dir.path.string()});
             }) == "config file " + dir.path.string() + " is not a regular file");
  const std::string fifo = (dir.path / "f.yaml").string();
  BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  BOOST_TEST(error_of([&] {
               parse({"--config", fifo});
             }) == "config file " + fifo + " is not a regular file");
  // A complex key.
  const std::string complex = dir.file("complex.yaml", "? [a, b]\n: 1\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", complex});
             }) == "config file " + complex + " has a key that is not a plain name");
  // Found by CI's fuzzing (fuzz_train_config): a complex key under opt: was an internal error.
  const std::string opt_kind = dir.file("opt-kind.yaml", "opt:\n  {a: 1}: 2\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", opt_kind});
             }) == "a key under opt: in config file " + opt_kind + " must be a single value");
  // An fp8 recipe's options in the file need a recipe, as on the command line; with one, they are read.
  const std::string opt_fp8 = dir.file("opt-fp8.yaml", "opt:\n  fp8_recipe: {margin: 1}\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", opt_fp8});
             }) ==
             "fp8_recipe.margin is an fp8 recipe's option, but no recipe is selected: add --fp8 RECIPE");
  BOOST_TEST(
      parse({"--config", opt_fp8, "--fp8", "delayed"}).plugin_options_file.at("fp8_recipe").at("margin") ==
      "1");
  const std::string opt_name = dir.file("opt-name.yaml", "opt:\n  scaler:\n    { ,, ,, ,, ,, \r01}: 1024\n");
  BOOST_TEST(error_of([&] {
               parse({"--config", opt_name});
             }) == "a key under opt.scaler in config file " + opt_name + " must be a single value");
  // A key given twice in one mapping (yaml-cpp keeps both; the later won in silence under opt:, and
  // a top-level one was refused naming a command-line flag).
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {"steps: 3\nsteps: 5\n", "steps"},
           {"opt:\n  scaler: {init_scale: 8, init_scale: 16}\n", "opt.scaler.init_scale"},
           {"opt:\n  scaler: {init_scale: 8}\n  scaler: {growth_interval: 4}\n", "opt.scaler"},
           {"{\"precision\": \"bf16\", \"precision\": \"fp16\"}\n", "precision"}}) {
    const std::string twice = dir.file("twice.yaml", text);
    BOOST_TEST(error_of([&] {
                 parse({"--config", twice});
               }) == "config file " + twice + " gives key '" + key + "' twice: give each key once");
  }
  // Deep nesting is refused with a message that says so.
  const std::string deep = dir.file("deep.yaml", std::string(5000, '[') + std::string(5000, ']') + "\n");
  BOOST_TEST(error_of([&] { parse({"--config", deep}); }).find("config file " + deep) == 0u);
  // Output files that are not regular files are refused before training (a device was replaced).
  BOOST_TEST(error_of([] {
               parse({"--summary", "/dev/full"});
             }) == "--summary /dev/full exists and is not a regular file; give a file path");
  BOOST_TEST(error_of([&] {
               parse({"--metrics", dir.path.string()});
             }) == "--metrics " + dir.path.string() + " exists and is not a regular file; give a file path");
  BOOST_TEST(error_of([] {
               parse({"--layer-norms", "/proc/version"});
             }).empty());  // a regular file (read-only: fails at open)
}

// JSON holds only UTF-8: bytes that are not are refused where they enter, not at the first
// checkpoint after training.
BOOST_AUTO_TEST_CASE(text_that_is_not_utf8_is_refused_where_it_enters) {
  BOOST_TEST(!invalid_utf8_at("h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e"));  // é, €, a 4-byte one
  BOOST_TEST(invalid_utf8_at("ab\xff").value() == 2u);
  BOOST_TEST(invalid_utf8_at("\xc0\xaf").value() == 0u);          // overlong '/'
  BOOST_TEST(invalid_utf8_at("x\xed\xa0\x80").value() == 1u);     // a surrogate
  BOOST_TEST(invalid_utf8_at("\xf4\x90\x80\x80").value() == 0u);  // above U+10FFFF
  BOOST_TEST(invalid_utf8_at("\xe2\x82").value() == 0u);          // cut short
  BOOST_TEST(error_of([] {
               parse({"--metrics", "m\xff.jsonl"});
             }) == "--metrics is not valid UTF-8 (byte 1); give UTF-8 text or paths");
  BOOST_TEST(error_of([] {
               parse({"--opt", "scaler.scale=\xc3\x28"});
             }) == "option scaler.scale is not valid UTF-8 (byte 0); give UTF-8 text or paths");
  // A plugin's saved State: the checkpoint is refused naming the plugin, and nothing is left.
  const Scratch dir;
  at::Tensor w = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  CheckpointManifest m;
  State state;
  state.set("note", std::string("caf\xe9"));  // Latin-1, not UTF-8
  m.plugins.push_back({"scaler", "latin", "1.0", state});
  const std::string e = error_of([&] { write_checkpoint(dir.path / "ckpt", m, {{"w", w}}, sgd, 2); });
  BOOST_TEST(e.find("scaler 'latin': its saved State has a key or string that is not UTF-8 (key 'note')") !=
                 std::string::npos,
             e);
  BOOST_TEST(!fs::exists(dir.path / "ckpt" / "step-0"));
  // A failed write leaves no temporary folder behind (retries on a full disk would pile them up).
  size_t left = 0;
  for (const auto& entry : fs::directory_iterator(dir.path / "ckpt"))
    left += entry.path().filename().string().rfind(".tmp-", 0) == 0;
  BOOST_TEST(left == 0u);
}

// torchrun's variables that contradict each other are refused at start (this layout once
// passed validation and failed at the rendezvous).
BOOST_AUTO_TEST_CASE(an_inconsistent_torchrun_environment_is_refused) {
  {
    const ScopedEnv env({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "0"},
                         {"LOCAL_WORLD_SIZE", "2"},
                         {"GROUP_RANK", "0"}});
    BOOST_TEST(error_of([] {
                 parse({"--comm", "gloo"});
               }) ==
               "inconsistent launcher environment: RANK=3 but GROUP_RANK=0 x LOCAL_WORLD_SIZE=2 + "
               "LOCAL_RANK=0 is 0");
  }
  const ScopedEnv good({{"RANK", "3"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"GROUP_RANK", "1"}});
  const TrainConfig cfg = parse({"--comm", "gloo"});
  BOOST_TEST(cfg.dist.rank == 3);
}

// --steps on the command line overrides epochs from the config file (and the reverse), as the
// command line overrides every other option; both in one source is still an error.
BOOST_AUTO_TEST_CASE(the_command_line_sets_the_run_length_over_the_config_file) {
  const Scratch dir;
  const std::string epochs = dir.file("epochs.yaml", "epochs: 3\n");
  const TrainConfig steps = parse({"--config", epochs, "--steps", "7"});
  BOOST_TEST(steps.steps == 7);
  BOOST_TEST(steps.epochs == 0);
  for (const auto& s : steps.settings) BOOST_TEST(s.name != "epochs");
  const std::string steps_file = dir.file("steps.yaml", "steps: 9\n");
  const TrainConfig two = parse({"--config", steps_file, "--epochs", "2"});
  BOOST_TEST(two.epochs == 2);
  BOOST_TEST(two.steps == 0);
  const std::string both = dir.file("both.yaml", "steps: 9\nepochs: 2\n");
  BOOST_TEST(error_of([&] { parse({"--config", both}); }) == "give --epochs or --steps, not both");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(launcher_environment)

BOOST_AUTO_TEST_CASE(torchrun_then_slurm_then_open_mpi) {
  const auto torchrun = lookup({{"WORLD_SIZE", "8"}, {"SLURM_NTASKS", "4"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  auto v = launcher_value(host_option("world-size"), torchrun);
  BOOST_REQUIRE(v);
  BOOST_TEST(v->first == "8");
  BOOST_TEST(v->second == "environment (WORLD_SIZE)");
  v = launcher_value(host_option("world-size"), lookup({{"WORLD_SIZE", ""}, {"SLURM_NTASKS", "4"}}));
  BOOST_TEST(v->first == "4");  // an empty variable counts as unset
  v = launcher_value(host_option("rank"), lookup({{"OMPI_COMM_WORLD_RANK", "3"}}));
  BOOST_TEST(v->second == "environment (OMPI_COMM_WORLD_RANK)");
  BOOST_TEST(!launcher_value(host_option("batch-size"), torchrun));  // not a launcher option
}

BOOST_AUTO_TEST_CASE(slurm_values_are_reduced_to_what_the_option_means) {
  auto v = launcher_value(host_option("nproc-per-node"), lookup({{"SLURM_NTASKS_PER_NODE", "2(x3)"}}));
  BOOST_TEST(v->first == "2");
  v = launcher_value(host_option("master-addr"), lookup({{"SLURM_JOB_NODELIST", "node[07-08],gpu3"}}));
  BOOST_TEST(v->first == "node07");
  BOOST_TEST(v->second == "environment (SLURM_JOB_NODELIST)");
  v = launcher_value(host_option("master-addr"),
                     lookup({{"MASTER_ADDR", "10.0.0.1"}, {"SLURM_JOB_NODELIST", "node[1-2]"}}));
  BOOST_TEST(v->first == "10.0.0.1");
  BOOST_TEST(first_slurm_host("a1,a2") == "a1");
  BOOST_TEST(first_slurm_host("gpu[3,5]") == "gpu3");
  BOOST_TEST(first_slurm_host("solo") == "solo");
}

BOOST_AUTO_TEST_CASE(a_bad_launcher_value_names_its_variable) {
  const ScopedEnv env({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
  BOOST_TEST(error_of([] { parse({}); }) == "--rank must be an integer, got 'x' from environment (RANK)");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(fault_specs)

BOOST_AUTO_TEST_CASE(every_field_is_parsed) {
  const Fault f = parse_fault("spike@step=12,layer=layers.1,rank=1,target=grad,factor=50");
  BOOST_TEST(static_cast<int>(f.kind) == static_cast<int>(Fault::Kind::spike));
  BOOST_TEST(f.step == 12);
  BOOST_TEST(f.layer == "layers.1");
  BOOST_TEST(f.rank == 1);
  BOOST_TEST(static_cast<int>(f.target) == static_cast<int>(Fault::Target::grad));
  BOOST_TEST(f.factor == 50.0);
  const Fault d = parse_fault("nan@step=0");
  BOOST_TEST(d.rank == -1);
  BOOST_TEST(d.layer.empty());
  BOOST_TEST(d.factor == 1000.0);
}

BOOST_AUTO_TEST_CASE(bad_specs_say_what_is_wrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nan", "no '@' after the fault kind"},
      {"nann@step=1", "unknown fault kind 'nann'; did you mean 'nan'?"},
      {"nan@stp=1", "unknown key 'stp'; did you mean 'step'?"},
      {"nan@step=1,step=2", "step is given twice"},
      {"nan@layer=x", "step=N is required"},
      {"nan@step=1,target=grad", "target=grad needs layer=NAME"},
      {"nan@step=1,factor=5", "factor applies to spike faults only"},
      {"spike@step=1,factor=1", "factor must be a number > 1, got '1'"},
  };
  for (const auto& [spec, message] : cases)
    BOOST_TEST(error_of([&] { parse_fault(spec); }).find(message) != std::string::npos, spec);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nan_locator)

// Two linear layers; the second's weight holds a NaN, so its output is the first bad one.
BOOST_AUTO_TEST_CASE(the_first_module_with_a_non_finite_output_is_named) {
  at::manual_seed(0);
  torch::nn::Linear l1(4, 8), l2(8, 2);
  {
    at::NoGradGuard no_grad;
    l2->weight[1][3] = std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<at::Tensor> params = {l1->weight, l1->bias, l2->weight, l2->bias};
  const at::Tensor x = at::randn({3, 4});
  LocatorInputs in;
  in.forward = [&](int) {
    at::Tensor h = call("l1", l1, x).relu();
    return call("l2", l2, h).sum();
  };
  const NanLocation loc = locate_fault(in, params);
  BOOST_TEST(loc.found);
  BOOST_TEST(loc.module == "l2");
  BOOST_TEST(loc.phase == "forward");
  BOOST_TEST(loc.observation.value.nonfinite == 3);  // column 1 of every row
  BOOST_TEST(loc.forward.size() == 2u);
  for (const auto& p : params) BOOST_TEST(!p.grad().defined());  // gradients left undefined
}

BOOST_AUTO_TEST_CASE(a_healthy_step_reports_nothing) {
  torch::nn::Linear l1(4, 2);
  LocatorInputs in;
  const at::Tensor x = at::ones({2, 4});
  in.forward = [&](int) { return call("l1", l1, x).sum(); };
  const NanLocation loc = locate_fault(in, {l1->weight, l1->bias});
  BOOST_TEST(!loc.found);
}

// The recording the Python package drives (its forward hooks tap; it runs backward itself): the
// same judgement as locate_fault, here on an overflowing gradient under finite outputs.
BOOST_AUTO_TEST_CASE(a_recording_names_the_first_bad_gradient_in_backward_order) {
  at::manual_seed(0);
  torch::nn::Linear l1(4, 8), l2(8, 2);
  {
    at::NoGradGuard no_grad;
    l2->weight.mul_(100);
  }
  const at::Tensor x = at::randn({3, 4});
  LocatorRecording recording;
  at::Tensor loss = call("l2", l2, call("l1", l1, x).relu()).sum();
  // Finite outputs; l2's output gradient is 1e38 (finite), l1's (100x l2's weights times that)
  // overflows float32: the first non-finite gradient in backward order is l1's.
  (loss * 1e38).backward();
  const NanLocation loc = recording.finish(loss.item<double>());
  BOOST_TEST(loc.found);
  BOOST_TEST(loc.module == "l1");
  BOOST_TEST(loc.phase == "backward");
  BOOST_TEST(loc.observation.value.nonfinite > 0);
  BOOST_TEST(loc.forward.size() == 2u);
  BOOST_TEST(!tap("l3", at::Tensor(), x).is_same(at::Tensor()));  // no hook left active
  BOOST_TEST(error_of([&] { recording.finish(0.0); }).find("already finished") != std::string::npos);
  LocatorRecording healthy;
  const at::Tensor y = call("l1", l1, x).sum();
  const NanLocation none = healthy.finish(y.item<double>());
  BOOST_TEST(!none.found);
  BOOST_TEST(none.finding.find("no non-finite value") != std::string::npos);
  BOOST_TEST(none.forward.size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(metrics_resume)

BOOST_AUTO_TEST_CASE(a_resumed_run_keeps_earlier_steps_and_rewrites_the_rest) {
  const fs::path file = fs::temp_directory_path() / ("ampkit-units-" + std::to_string(::getpid()) + ".jsonl");
  {
    MetricsWriter w(file);
    for (int s = 0; s < 5; ++s) w.write({{"step", s}, {"loss", 1.0 / (s + 1)}});
  }
  {
    std::ofstream(file, std::ios::app) << "{\"step\": 5, \"lo";  // a line torn by a crash
  }
  {
    MetricsWriter w(file, /*first_step=*/3);  // resumed from the checkpoint of step 3
    w.write({{"step", 3}, {"loss", 0.125}});
  }
  std::ifstream in(file);
  std::vector<int64_t> steps;
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    steps.push_back(r["step"].get<int64_t>());
    losses.push_back(r["loss"].get<double>());
  }
  fs::remove(file);
  BOOST_TEST(steps == (std::vector<int64_t>{0, 1, 2, 3}), boost::test_tools::per_element());
  BOOST_TEST(losses[3] == 0.125);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(step_records)

// JSON has no inf or NaN: the record keeps them as numbers and its line spells them as strings;
// what only a host knows (rollbacks, top_layers, ...) is written only when set.
BOOST_AUTO_TEST_CASE(a_record_spells_non_finite_numbers_and_writes_only_what_is_set) {
  StepRecord r;
  r.step = 7;
  r.scale = 1024;
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.action = NanAction::skip_backoff;
  const nlohmann::json j = r.to_json();
  BOOST_TEST(j.at("step").get<int64_t>() == 7);
  BOOST_TEST(j.at("scale").get<double>() == 1024.0);
  BOOST_TEST(j.at("loss").get<std::string>() == "nan");
  BOOST_TEST(j.at("grad_norm").get<std::string>() == "inf");
  BOOST_TEST(j.at("action").get<std::string>() == "skip_backoff");
  for (const char* key : {"reason", "rank_samples_per_second", "data_step", "steps_discarded", "rollbacks",
                          "located", "top_layers"})
    BOOST_TEST(!j.contains(key), key);
  r.rollbacks = 2;
  r.top_layers = top_layers({"a", "b", "c"}, {1.0, std::nan(""), 3.0}, 2);
  const nlohmann::json k = r.to_json();
  BOOST_TEST(k.at("rollbacks").get<int64_t>() == 2);
  BOOST_TEST(k.at("top_layers").dump() == R"([{"grad_norm":"nan","name":"b"},{"grad_norm":3.0,"name":"c"}])");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(workloads)

// The synthetic workload's training labels are computed inside the trainer's autocast region;
// they must be those of fp32 whatever --precision is (evaluation labels always were).
BOOST_AUTO_TEST_CASE(synthetic_labels_do_not_depend_on_the_precision) {
  at::manual_seed(11);
  const at::Tensor x = at::randn({64 * 100, 128}), teacher = at::randn({128, 10});
  const at::Tensor fp32 = train::synthetic_labels(x, teacher);
  BOOST_TEST(at::equal(fp32, at::matmul(x, teacher).argmax(1)));
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    AutocastGuard autocast(p, at::kCPU);
    BOOST_TEST(at::equal(train::synthetic_labels(x, teacher), fp32), to_string(p));
    // What the labels were before: argmax of the autocast matmul, which differs on some samples.
    const int64_t differing = at::ne(at::matmul(x, teacher).argmax(1), fp32).sum().item<int64_t>();
    BOOST_TEST(differing > 0, to_string(p));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(precision_warnings_)

train::PrecisionFacts facts(Precision p, std::string scaler, bool dynamic, double scale) {
  train::PrecisionFacts f;
  f.precision = p;
  f.scaler = std::move(scaler);
  f.scaler_dynamic = dynamic;
  f.scale = scale;
  f.scale_is_option = f.scaler == "static";
  return f;
}

std::vector<std::string> warnings(const train::PrecisionFacts& f) {
  std::vector<std::string> lines;
  for (const train::PrecisionAdvice& advice : train::precision_warnings(f))
    lines.push_back(advice.summary_line());
  return lines;
}

BOOST_AUTO_TEST_CASE(each_mismatch_gets_its_own_right_advice) {
  using V = std::vector<std::string>;
  // fp16 without any scaler: suggest one.
  BOOST_TEST(
      warnings(facts(Precision::fp16, "none", false, 1.0)) ==
          V{"--precision fp16 with scaler 'none' (scale 1): gradients below 6e-8 underflow to zero in fp16; "
            "use --scaler dynamic or --scaler static"},
      boost::test_tools::per_element());
  // fp16 with static at scale 1: raise the scale (it already is --scaler static).
  BOOST_TEST(warnings(facts(Precision::fp16, "static", false, 1.0)) ==
                 V{"--precision fp16 with scaler 'static' (scale 1): gradients below 6e-8 underflow to zero "
                   "in fp16; "
                   "raise it (--opt scaler.scale=1024) or use --scaler dynamic"},
             boost::test_tools::per_element());
  // fp16 with static below 1: worse than none.
  BOOST_TEST(
      warnings(facts(Precision::fp16, "static", false, 0.5)) ==
          V{"--precision fp16 with scaler 'static' (scale 0.5): a scale below 1 pushes gradients further "
            "into fp16's underflow (below 6e-8 they become zero); use a scale of at least 1, usually a "
            "power of two such as 1024, or --scaler dynamic"},
      boost::test_tools::per_element());
  // A dynamic scaler outside fp16: the reason names the precision's own property.
  BOOST_TEST(
      warnings(facts(Precision::bf16, "dynamic", true, 65536)) ==
          V{"--precision bf16 with the dynamic loss scaler 'dynamic': bf16 has fp32's exponent range, so "
            "scaling only costs work; use --scaler none"},
      boost::test_tools::per_element());
  BOOST_TEST(
      warnings(facts(Precision::fp32, "predictive", true, 65536)) ==
          V{"--precision fp32 with the dynamic loss scaler 'predictive': fp32 gradients do not underflow, "
            "so scaling only costs work; use --scaler none"},
      boost::test_tools::per_element());
  // A constant scale outside fp16 is flagged like a dynamic one.
  BOOST_TEST(
      warnings(facts(Precision::bf16, "static", false, 65536)) ==
          V{"--precision bf16 with scaler 'static' (scale 65536): bf16 has fp32's exponent range, so a "
            "constant scale only costs work (and a large one can overflow); use --scaler none"},
      boost::test_tools::per_element());
  BOOST_TEST(warnings(facts(Precision::fp32, "static", false, 0.5)).size() == 1u);
}

BOOST_AUTO_TEST_CASE(the_usual_settings_are_quiet) {
  BOOST_TEST(warnings(facts(Precision::fp16, "static", false, 1024)).empty());
  BOOST_TEST(warnings(facts(Precision::fp16, "dynamic", true, 65536)).empty());
  BOOST_TEST(warnings(facts(Precision::bf16, "none", false, 1.0)).empty());
  BOOST_TEST(warnings(facts(Precision::bf16, "static", false, 1.0)).empty());
  BOOST_TEST(warnings(facts(Precision::fp32, "none", false, 1.0)).empty());
  train::PrecisionFacts clipped = facts(Precision::fp16, "dynamic", true, 65536);
  // The clipper's own per-precision defaults (norm's: fp16 1, bf16 5, fp32 10) tell which value
  // belongs to another precision.
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"fp16", "1"}, {"bf16", "5"}, {"fp32", "10"}};
  clipped.clipper_set = {{"max_norm", "1", defaults}};
  BOOST_TEST(warnings(clipped).empty());
  clipped.clipper_set = {{"max_norm", "5", {}}};
  BOOST_TEST(warnings(clipped).empty());  // a clipper without per-precision defaults: no advice
  // adaptive's max_norm starts at 10 for fp16: there 10 is its own default, not fp32's.
  clipped.clipper_set = {{"max_norm", "10", {{"fp16", "10"}, {"bf16", "50"}, {"fp32", "100"}}}};
  BOOST_TEST(warnings(clipped).empty());
  clipped.clipper_set = {{"max_norm", "5", defaults}};
  BOOST_TEST(
      warnings(clipped) ==
          std::vector<std::string>{"note: clipper.max_norm=5 is the usual bf16 starting point; fp16 runs "
                                   "usually start at 1.0 (docs/gradient-clipping.md)"},
      boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tensorboard)

BOOST_AUTO_TEST_CASE(crc32c_is_castagnolis_and_masked_as_tfrecord_does) {
  const std::string check = "123456789";  // the standard check value of CRC-32C
  BOOST_TEST(crc32c(check.data(), check.size()) == 0xE3069283u);
  BOOST_TEST(crc32c("", 0) == 0u);
  const uint32_t c = 0xE3069283u;
  BOOST_TEST(masked_crc32c(check.data(), check.size()) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

BOOST_AUTO_TEST_CASE(the_tensorboard_folder_must_be_a_folder) {
  const fs::path file = fs::temp_directory_path() / ("ampkit-units-tb-" + std::to_string(::getpid()));
  std::ofstream(file) << "x";
  BOOST_TEST(error_of([&] {
               parse({"--tensorboard", file.string()});
             }) == "--tensorboard " + file.string() + " exists and is not a folder; give a folder path");
  fs::remove(file);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(batch_copies)

// On the CPU a batch is used where it is (no copy, no pinning: pinning needs a CUDA runtime).
BOOST_AUTO_TEST_CASE(a_cpu_batch_stays_where_it_is) {
  const at::Tensor x = at::randn({4, 3});
  const at::Tensor y = train::to_device(x, at::Device(at::kCPU));
  BOOST_TEST(y.data_ptr() == x.data_ptr());
  BOOST_TEST(!y.is_pinned());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// Rank 0 of a 2-rank job whose peer is scripted: every gather (an all_gather) gets rank 1's row
// from `peer(call, n)`. The rank agreement
// checks are reached in-process this way; the CLI stops differing ranks earlier.
class ScriptedPeerComm final : public CommBackend {
 public:
  explicit ScriptedPeerComm(std::function<std::vector<double>(int call, size_t n)> peer)
      : peer_(std::move(peer)) {}
  void init(const DistributedConfig&) override {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce_mean(std::vector<at::Tensor>&) override { throw std::logic_error("not scripted"); }
  at::Tensor all_gather(const at::Tensor& t) override {
    const std::vector<double> theirs = peer_(calls_++, static_cast<size_t>(t.numel()));
    const at::Tensor peer = at::tensor(at::ArrayRef<double>(theirs), at::TensorOptions().dtype(at::kDouble));
    return at::stack({t.to(at::kDouble), peer.view(t.sizes())});
  }
  void broadcast(std::vector<at::Tensor>&, int) override {}
  void barrier() override {}
  int calls() const { return calls_; }

 private:
  std::function<std::vector<double>(int, size_t)> peer_;
  int calls_ = 0;
};

// The peer's side of gather_strings: its length, then its bytes padded to the longest.
std::function<std::vector<double>(int, size_t)> peer_text(const std::string& text) {
  return [text](int call, size_t n) {
    if (call == 0) return std::vector<double>{static_cast<double>(text.size())};
    std::vector<double> bytes(n, 0.0);
    for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
    return bytes;
  };
}

std::string settings_text(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string text;
  for (const auto& [name, value] : settings) text += name + '\t' + value + '\n';
  return text;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(rank_agreement)

BOOST_AUTO_TEST_CASE(strings_travel_whole_in_rank_order) {
  ScriptedPeerComm comm(peer_text("a longer text from rank 1"));
  const auto all = train::gather_strings(comm, "rank 0", at::Device(at::kCPU));
  BOOST_REQUIRE_EQUAL(all.size(), 2u);
  BOOST_TEST(all[0] == "rank 0");
  BOOST_TEST(all[1] == "a longer text from rank 1");
  BOOST_TEST(comm.calls() == 2);  // lengths, then bytes
}

BOOST_AUTO_TEST_CASE(different_settings_are_named_with_each_ranks_value) {
  const std::vector<std::pair<std::string, std::string>> mine = {
      {"--steps", "3"}, {"--lr", "0.001"}, {"--clipper", "norm"}, {"clipper.max_norm", "10"}};
  {
    ScriptedPeerComm same(peer_text(settings_text(mine)));
    BOOST_CHECK_NO_THROW(train::check_same_settings(same, at::Device(at::kCPU), mine));
  }
  ScriptedPeerComm other(peer_text(settings_text(
      {{"--steps", "3"}, {"--lr", "0.002"}, {"--clipper", "value"}, {"clipper.clip_value", "1"}})));
  try {
    train::check_same_settings(other, at::Device(at::kCPU), mine);
    BOOST_FAIL("no error");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.category()) == static_cast<int>(ErrorCategory::distributed));
    BOOST_TEST(
        std::string(e.what()) ==
        "the ranks were started with different settings: --lr (rank 0: 0.001, rank 1: 0.002), --clipper "
        "(rank 0: norm, rank 1: value), clipper.max_norm (rank 0: 10, rank 1: not set), clipper.clip_value "
        "(rank 0: not set, rank 1: 1); start every rank with the same ones");
  }
}

// What every rank must agree on right after the rendezvous is a column of the option table.
BOOST_AUTO_TEST_CASE(the_table_marks_the_settings_every_rank_must_share) {
  std::set<std::string> shared;
  for (const HostOption& o : host_option_table())
    if (o.same_on_every_rank) shared.insert(o.name);
  const std::set<std::string> expected = {"workload",
                                          "precision",
                                          "epochs",
                                          "steps",
                                          "batch-size",
                                          "accumulate",
                                          "lr",
                                          "seed",
                                          "optimizer",
                                          "weight-decay",
                                          "lr-schedule",
                                          "warmup-steps",
                                          "synthetic-width",
                                          "synthetic-depth",
                                          "synthetic-inputs",
                                          "synthetic-classes",
                                          "gpt-layers",
                                          "gpt-width",
                                          "gpt-heads",
                                          "gpt-context",
                                          "loss",
                                          "data-order",
                                          "scaler",
                                          "clipper",
                                          "nan-policy",
                                          "comm",
                                          "fp8",
                                          "world-size",
                                          "bucket-cap-mb",
                                          "find-unused-parameters",
                                          "broadcast-buffers",
                                          "gradient-as-bucket-view",
                                          "check-ranks",
                                          "checkpoint-every",
                                          "nan-locate"};
  BOOST_TEST(shared == expected);
}

BOOST_AUTO_TEST_CASE(a_stop_signal_travels_in_the_step_values) {
  // Rank 0 and rank 1's rows of the step's packed collective: stop signal, samples/s share.
  const train::RankStep r = train::read_step_rank_values({0, 50, 15, 48});
  BOOST_TEST(r.stop_signal == 15);  // SIGTERM on rank 1 stops rank 0 after the same step
  BOOST_REQUIRE_EQUAL(r.samples_per_second.size(), 2u);
  BOOST_TEST(r.samples_per_second[0] == 50.0);
  BOOST_TEST(r.samples_per_second[1] == 48.0);
  BOOST_TEST(train::read_step_rank_values({0, 50, 0, 48}).stop_signal == 0);
}

BOOST_AUTO_TEST_CASE(check_ranks_stops_the_job_on_a_different_decision_or_scale) {
  StepOutcome out;
  out.decision.action = NanAction::skip;
  out.scale_next = 256;
  // The peer's row: decision, next scale.
  ScriptedPeerComm agree([](int, size_t) { return std::vector<double>{1, 256}; });
  train::check_same_decision(agree, at::Device(at::kCPU), 7, out);
  BOOST_TEST(agree.calls() == 1);
  ScriptedPeerComm differ([](int, size_t) { return std::vector<double>{0, 128}; });
  try {
    train::check_same_decision(differ, at::Device(at::kCPU), 7, out);
    BOOST_FAIL("no error");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.category()) == static_cast<int>(ErrorCategory::distributed));
    BOOST_TEST(
        std::string(e.what()).rfind("ranks disagree at step 7: rank 0 decided skip with scale 256", 0) == 0,
        e.what());
    BOOST_TEST(std::string(e.what()).find("rank 1 decided proceed with scale 128") != std::string::npos,
               e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nan_report_order)

// Gathered in rank order, rank 0's "not located" led the summary's nan_reports; now each step's
// locating reports lead it, and located_by names the rank that located the first fault.
BOOST_AUTO_TEST_CASE(the_locating_report_leads_its_step_and_names_located_by) {
  nlohmann::json reports = nlohmann::json::parse(R"([
      {"step": 9, "rank": 0, "located": true}, {"step": 5, "rank": 0, "located": false},
      {"step": 5, "rank": 2, "located": true}, {"step": 5, "rank": 1, "located": true},
      {"step": 5, "rank": 3, "located": false}])");
  train::order_nan_reports(reports);
  std::vector<std::pair<int, int>> order;  // step, rank
  for (const auto& r : reports) order.emplace_back(r["step"].get<int>(), r["rank"].get<int>());
  const std::vector<std::pair<int, int>> expected = {{5, 1}, {5, 2}, {5, 0}, {5, 3}, {9, 0}};
  BOOST_TEST((order == expected), reports.dump());
  BOOST_TEST(train::first_fault_located_by(reports).dump() == "1");
  // No rank located the first fault: null, though a later one was located.
  nlohmann::json unlocated = nlohmann::json::parse(
      R"([{"step": 9, "rank": 1, "located": true}, {"step": 5, "rank": 0, "located": false}])");
  train::order_nan_reports(unlocated);
  BOOST_TEST(unlocated[0]["step"].get<int>() == 5);
  BOOST_TEST(train::first_fault_located_by(unlocated).is_null());
  BOOST_TEST(train::first_fault_located_by(nlohmann::json::array()).is_null());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace ampkit::test

// Ranks sharing a node split its cores unless told otherwise.
BOOST_AUTO_TEST_CASE(ranks_of_a_node_split_its_cores_unless_told_otherwise) {
  using ampkit::threads_for_rank;
  BOOST_TEST(threads_for_rank(0, 2, false, 2) == 1);
  BOOST_TEST(threads_for_rank(0, 4, false, 16) == 4);
  BOOST_TEST(threads_for_rank(0, 3, false, 16) == 5);
  BOOST_TEST(threads_for_rank(0, 8, false, 2) == 1);   // never 0 threads
  BOOST_TEST(threads_for_rank(3, 2, false, 16) == 3);  // an explicit --threads wins
  BOOST_TEST(threads_for_rank(0, 2, true, 16) == 0);   // OMP_NUM_THREADS set: LibTorch follows it
  BOOST_TEST(threads_for_rank(0, 1, false, 16) == 0);  // one rank: LibTorch's own choice
  BOOST_TEST(threads_for_rank(0, 2, false, 0) == 1);   // hardware_concurrency unknown
}
