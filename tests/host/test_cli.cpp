// ampkit-train and ampkit-plugins as a user runs them: exit codes, one-line errors, config
// sources, summaries, determinism and NaN handling.
#define BOOST_TEST_MODULE host
#include <ampkit/device_support.h>
#include <ampkit/version.h>
#include <elf.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_paths.h"
#include "train_process.h"

namespace fs = std::filesystem;

namespace {

using ampkit::cpu_capabilities;
using ampkit::cpu_precision_note;
using ampkit::CpuCapabilities;
using ampkit::Precision;
using ampkit::test::count_newlines;
using ampkit::test::read_json;
using ampkit::test::Result;
using ampkit::test::run;
using ampkit::test::running;
using ampkit::test::small_run_args;
using ampkit::test::spawn;
using ampkit::test::TempDir;
using ampkit::test::tiny;
using ampkit::test::tiny_model_args;
using ampkit::test::train;
using ampkit::test::wait_exit_code;
using ampkit::test::words;

// ampkit-train's output without the note on a CPU that is slow in bf16 or fp16 (printed or not
// depending on the machine; its own test checks it against the machine's flags).
std::string without_cpu_note(std::string output) {
  const std::string head = "ampkit-train: note: this CPU";
  for (size_t at; (at = output.find(head)) != std::string::npos;)
    output.erase(
        at, output.find('\n', at) == std::string::npos ? std::string::npos : output.find('\n', at) - at + 1);
  return output;
}

const std::string plugins = std::string(ampkit::test::bin_dir()) + "/ampkit-plugins";
// tiny (tests/support/train_process.h) without its --workload, for the cases that name their own.
const std::string tiny_no_workload = train + " " + small_run_args + " " + tiny_model_args;

// The whitespace-separated words of the first line of `text` starting with `start`.
std::vector<std::string> words_of_line(const std::string& text, const std::string& start) {
  std::istringstream lines_in(text);
  for (std::string line; std::getline(lines_in, line);)
    if (line.rfind(start, 0) == 0) return words(line);
  return {};
}

}  // namespace

// What users see of the option table (--help, --print-config, errors) stays as recorded in
// tests/data/host (cases.txt lists the commands; tools/golden/host_cli_goldens.sh rewrites them for
// an intended change). The plugin folder and the data folder are written as placeholders.
BOOST_AUTO_TEST_CASE(help_print_config_and_errors_match_the_recorded_outputs) {
  const std::string data = std::string(ampkit::test::data_dir()) + "/host";
  const std::string plugin_dir = fs::canonical(ampkit::test::plugin_dir()).string();
  std::ifstream cases(data + "/cases.txt");
  BOOST_REQUIRE(cases);
  int compared = 0;
  for (std::string line; std::getline(cases, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t bar1 = line.find('|'), bar2 = line.find('|', bar1 + 1);
    const std::string name = line.substr(0, bar1);
    const std::string env = line.substr(bar1 + 1, bar2 - bar1 - 1);
    std::string args = line.substr(bar2 + 1);
    for (size_t at; (at = args.find("@DATA@")) != std::string::npos;) args.replace(at, 6, data);
    const auto r = run("cd " + data + " && env -u AMPKIT_PLUGIN_PATH " + env + " " + train + " " + args);
    std::string out = without_cpu_note(r.output);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    for (const auto& [from, to] : {std::pair{plugin_dir, std::string("<PLUGIN_DIR>")}, {data, "<DATA>"}})
      for (size_t at; (at = out.find(from)) != std::string::npos;) out.replace(at, from.size(), to);
    std::ifstream golden(data + "/" + name + ".txt");
    BOOST_REQUIRE_MESSAGE(golden, "missing golden " << name);
    std::stringstream want;
    want << golden.rdbuf();
    BOOST_TEST(("exit " + std::to_string(r.code) + "\n" + out + "\n") == want.str(),
               "case " << name << " differs from tests/data/host/" << name << ".txt");
    ++compared;
  }
  BOOST_TEST(compared == 15);
}

BOOST_AUTO_TEST_CASE(bad_inputs_give_one_line_and_a_documented_exit_code) {
  TempDir tmp;
  fs::create_symlink(tmp.path / "loop-b", tmp.path / "loop-a");
  fs::create_symlink(tmp.path / "loop-a", tmp.path / "loop-b");
  {
    std::ofstream(tmp.path / "bad.yaml") << "precision: [bf16\n";
    std::ofstream(tmp.path / "unknown.yaml") << "precison: bf16\n";
  }
  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--scaler statc", 3, "unknown scaler 'statc'; did you mean 'static'? (available: "},
      {"--clipper nope", 3, "unknown clipper 'nope'"},
      {"--clipper static", 3, "unknown clipper 'static'; 'static' is a scaler plugin, not a clipper plugin"},
      {"--opt nan_policy.max_consecutive=+5", 2,
       "option 'max_consecutive' of nan_policy 'skip' must be an integer, got '+5'"},
      {"--opt nan_policy.max_consecutive=2.5", 2, "must be an integer, got '2.5'"},
      {"--scaler static --opt scaler.sacle=2", 2,
       "unknown option 'sacle' for scaler 'static' (from command line); did you mean 'scale'?"},
      {"--scaler static --opt scaler.scale=abc", 2,
       "option 'scale' of scaler 'static' must be a finite number, got 'abc'"},
      {"--scaler static --opt scaler.scale=0", 2,
       "option 'scale' of scaler 'static' must be float in (0, 3e+38], got '0'"},
      {"--clipper norm --opt clipper.norm_type=3", 2, "must be one of 2|inf, got '3'"},
      {"--opt scalar.scale=2", 2, "unknown plugin kind 'scalar'; did you mean 'scaler'?"},
      {"--opt scaler", 2, "--opt must be KIND.OPTION=VALUE"},
      {"--bach-size 8", 2, "did you mean 'batch-size'?"},
      {"--batch-size x", 2, "batch-size"},
      {"--precision fp8", 2, "--precision must be fp32, bf16 or fp16, got 'fp8'"},
      {"--epochs 1", 2, "give --epochs or --steps, not both"},
      {"--lr -1", 2, "--lr must be > 0, got -1"},
      {"--config /nonexistent.yaml", 2, "config file /nonexistent.yaml does not exist"},
      {"--config " + (tmp.path / "bad.yaml").string(), 2, "is not valid YAML"},
      {"--config " + (tmp.path / "unknown.yaml").string(), 2,
       "unknown key 'precison' in config file " + (tmp.path / "unknown.yaml").string() +
           "; did you mean 'precision'?"},
      {"--plugin-dir /nonexistent", 2, "--plugin-dir /nonexistent is not a folder"},
      // A name too long or a symlink loop is the user's input, not an internal error.
      {"--plugin-dir /tmp/" + std::string(300, 'a'), 2, " cannot be used: File name too long"},
      {"--plugin-dir " + (tmp.path / "loop-a").string(), 2,
       "loop-a cannot be used: Too many levels of symbolic links"},
      {"--config " + (tmp.path / "loop-a").string(), 2,
       "loop-a cannot be read: Too many levels of symbolic links"},
      {"--data-dir " + tmp.path.string() + " --workload=fashion-mnist", 4,
       "install the Debian package dataset-fashion-mnist"},
      {"--scaler /nonexistent/libx.so", 3, "plugin file /nonexistent/libx.so: does not exist"},
      // An output file that cannot be written is exit 9, not a usage error or an internal one.
      {"--metrics /proc/ampkit-none/m.jsonl", 9, "cannot create the folder of /proc/ampkit-none/m.jsonl"},
      {"--summary /proc/ampkit-none/s.json", 9, "cannot create the folder of /proc/ampkit-none/s.json"},
  };
  for (const auto& c : cases) {
    const std::string workload =
        c.args.find("--workload") == std::string::npos ? " --workload synthetic" : "";
    const Result r = run(tiny_no_workload + workload + " --steps 2 " + c.args);
    BOOST_TEST_CONTEXT(c.args << " ->\n" << r.output) {
      BOOST_TEST(r.code == c.code);
      BOOST_TEST(r.output.find(c.message) != std::string::npos);
      BOOST_TEST(count_newlines(r.output) == 1u);
      BOOST_TEST(r.output.rfind("ampkit-train: error: ", 0) == 0u);
    }
  }
  // Unknown plugin option from the environment is an error too, never silently ignored.
  const Result env = run("AMPKIT_SCALER_SCLAE=4 " + tiny + " --steps 2 --scaler static");
  BOOST_TEST(env.code == 2);
  BOOST_TEST(env.output.find("unknown option 'sclae' for scaler 'static' (from environment "
                             "AMPKIT_SCALER_SCLAE); did you mean 'scale'?") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(print_config_shows_each_value_and_its_source) {
  TempDir tmp;
  const fs::path cfg = tmp.path / "run.yaml";
  std::ofstream(cfg)
      << "precision: bf16\nbatch-size: 16\nscaler: static\nclipper: norm\n"
         "opt:\n  scaler:\n    scale: 128\n  clipper:\n    max_norm: 2.5\n    norm_type: inf\n";
  const Result r = run("AMPKIT_CLIPPER_MAX_NORM=3 " + train + " --config " + cfg.string() +
                       " --batch-size 8 --opt clipper.norm_type=2 --print-config");
  BOOST_TEST_INFO(r.output);
  BOOST_TEST(r.code == 0);
  auto has = [&](const std::string& s) { return r.output.find(s) != std::string::npos; };
  BOOST_TEST(has("precision                bf16"));
  BOOST_TEST(has("(config file " + cfg.string() + ")"));
  BOOST_TEST(has("batch-size               8"));
  BOOST_TEST(has("scale  float in (0, 3e+38]  128    config file " + cfg.string()));
  // command line > environment > config file > default
  BOOST_TEST(has("max_norm   float > 0     3      environment AMPKIT_CLIPPER_MAX_NORM"));
  BOOST_TEST(has("norm_type  choice 2|inf  2      command line"));
  BOOST_TEST(has("max_consecutive    int >= 0            50     default"));
}

BOOST_AUTO_TEST_CASE(help_lists_host_options_and_the_selected_plugins_options) {
  const Result r = run(train + " --scaler static --help");
  BOOST_TEST(r.code == 0);
  BOOST_TEST(r.output.find("--batch-size") != std::string::npos);
  BOOST_TEST(r.output.find("scaler 'static' options") != std::string::npos);
  BOOST_TEST(r.output.find("Constant the loss is multiplied by") != std::string::npos);
  BOOST_TEST(r.output.find("clipper 'none' options") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(training_writes_metrics_and_summary_and_is_deterministic) {
  TempDir tmp;
  const std::string common = tiny + " --steps 40 --seed 5 --clipper norm --opt clipper.max_norm=0.05 ";
  const Result a = run(common + "--metrics " + (tmp.path / "a.jsonl").string() + " --summary " +
                       (tmp.path / "a.json").string());
  BOOST_TEST_INFO(a.output);
  BOOST_REQUIRE(a.code == 0);
  const Result b = run(common + "--summary " + (tmp.path / "b.json").string());
  const Result c = run(tiny + " --steps 40 --seed 6 --clipper norm --opt clipper.max_norm=0.05 --summary " +
                       (tmp.path / "c.json").string());
  BOOST_REQUIRE(b.code == 0);
  BOOST_REQUIRE(c.code == 0);
  const auto sa = read_json(tmp.path / "a.json"), sb = read_json(tmp.path / "b.json"),
             sc = read_json(tmp.path / "c.json");
  for (const char* key :
       {"workload", "precision", "plugins", "steps", "skipped_steps", "nan_events", "final_loss",
        "test_accuracy", "samples_per_second", "wall_seconds", "param_sha256"})
    BOOST_TEST(sa.contains(key), key);
  BOOST_TEST(sa["steps"].get<int>() == 40);
  BOOST_TEST(sa["plugins"]["clipper"]["name"].get<std::string>() == "norm");
  BOOST_TEST(sa["param_sha256"].get<std::string>().size() == 64u);
  BOOST_TEST(sa["param_sha256"] == sb["param_sha256"]);  // same seed: bit-identical parameters
  BOOST_TEST(sa["param_sha256"] != sc["param_sha256"]);
  std::ifstream metrics(tmp.path / "a.jsonl");
  std::string line;
  int n = 0, clipped = 0;
  while (std::getline(metrics, line)) {
    const auto r = nlohmann::json::parse(line);
    BOOST_TEST(r["step"].get<int>() == n);
    if (r["clipped"].get<bool>()) {
      ++clipped;
      BOOST_TEST(r["grad_norm_clipped"].get<double>() == 0.05, boost::test_tools::tolerance(1e-5));
    }
    ++n;
  }
  BOOST_TEST(n == 40);
  BOOST_TEST(clipped > 0);
  BOOST_TEST(sa["clip_rate"].get<double>() == clipped / 40.0, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(overflowing_fp16_steps_are_skipped_then_the_policy_aborts) {
  TempDir tmp;
  // A scale of 1e38 overflows every fp16 backward: every step is skipped, none applied.
  const Result skip = run(tiny +
                          " --precision fp16 --steps 6 --scaler static --opt scaler.scale=1e38 "
                          "--opt nan_policy.max_consecutive=0 --summary " +
                          (tmp.path / "s.json").string());
  BOOST_TEST_INFO(skip.output);
  BOOST_REQUIRE(skip.code == 0);
  const auto s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["skipped_steps"].get<int>() == 6);
  BOOST_TEST(s["nan_events"].get<int>() == 6);
  BOOST_TEST(s["steps_taken"].get<int>() == 0);
  const Result abort = run(tiny +
                           " --precision fp16 --steps 20 --scaler static --opt scaler.scale=1e38 "
                           "--opt nan_policy.max_consecutive=3 --summary " +
                           (tmp.path / "a.json").string());
  BOOST_TEST_INFO(abort.output);
  BOOST_TEST(abort.code == 5);
  BOOST_TEST(abort.output.find(
                 "training aborted by nan_policy 'skip' at step 2: non-finite gradients at loss scale 1e+38; "
                 "3 consecutive bad steps (nan_policy.max_consecutive=3): the loss is probably diverging") !=
             std::string::npos);
  const auto a = read_json(tmp.path / "a.json");
  BOOST_TEST(a["status"].get<std::string>() == "aborted");
  BOOST_TEST(a["steps"].get<int>() == 3);
}

BOOST_AUTO_TEST_CASE(ampkit_plugins_lists_shows_and_checks) {
  const Result list = run(plugins + " list");
  BOOST_TEST(list.code == 0);
  for (const char* s :
       {"scaler      none", "scaler      static", "clipper     norm", "nan_policy  skip", "comm        local",
        "fp8_recipe  current", "fp8_recipe  delayed", "fp8_recipe  predictive"})
    BOOST_TEST(list.output.find(s) != std::string::npos, s);
  const auto json = nlohmann::json::parse(run(plugins + " list --json").output);
  const size_t installed = json["plugins"].size();
  BOOST_TEST(installed >= 6u);
  BOOST_TEST(json["problems"].empty());
  const Result show = run(plugins + " show static");
  BOOST_TEST(show.code == 0);
  BOOST_TEST(show.output.find("scale  float in (0, 3e+38]  1024") != std::string::npos);
  const Result ambiguous = run(plugins + " show none");
  BOOST_TEST(ambiguous.code == 2);
  BOOST_TEST(ambiguous.output.find("add --kind KIND") != std::string::npos);
  BOOST_TEST(run(plugins + " show none --kind clipper").code == 0);
  // An fp8 recipe is selected by ampkit-train's --fp8 and by Python: show names both.
  const Result recipe = run(plugins + " show delayed");
  BOOST_TEST(recipe.code == 0);
  BOOST_TEST(recipe.output.find(
                 "select:   --fp8 delayed (ampkit-train), ampkit.fp8.convert(model, recipe=\"delayed\") in "
                 "Python\n  options:  --opt fp8_recipe.NAME=VALUE (opt={\"NAME\": VALUE} in Python) or "
                 "environment AMPKIT_FP8_RECIPE_NAME\n") != std::string::npos);
  BOOST_TEST(recipe.output.find("amax_history_len   int in [1, 65536]       1024") != std::string::npos);
  const Result check = run(plugins + " check");
  BOOST_TEST(check.code == 0);
  BOOST_TEST(check.output.find(std::to_string(installed) + " checked, 0 failed") != std::string::npos);
  BOOST_TEST(run(plugins + " lst").code == 2);
}

// check flags a file whose name disagrees with what it holds; list marks a plugin built against
// an edited StepStats (same ABI number) incompatible, in the table and in --json.
// A plugin file whose GNU_RELRO range reaches past its LOAD segment can survive a short-lived
// probe child (the stray mprotect goes unnoticed) and crash the host later, so the program
// headers are checked before any load, alike by `ampkit-plugins check` and by the host.
BOOST_AUTO_TEST_CASE(a_segment_outside_its_mapping_is_refused_by_check_and_by_the_host) {
  TempDir tmp;
  const fs::path file = tmp.path / "libampkit-scaler-relro.so";
  fs::copy_file(fs::path(ampkit::test::plugin_dir()) / "libampkit-scaler-static.so", file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    Elf64_Ehdr eh{};
    f.read(reinterpret_cast<char*>(&eh), sizeof eh);
    std::vector<Elf64_Phdr> headers(eh.e_phnum);
    f.seekg(static_cast<std::streamoff>(eh.e_phoff));
    f.read(reinterpret_cast<char*>(headers.data()),
           static_cast<std::streamsize>(sizeof(Elf64_Phdr) * eh.e_phnum));
    bool patched = false;
    for (size_t i = 0; i < headers.size(); ++i) {
      Elf64_Phdr& relro = headers[i];
      if (relro.p_type != PT_GNU_RELRO) continue;
      // As the reported file (memsz 0x338 raised to 0x7f38), but always past the end of the LOAD
      // segment that holds it, whatever this build's segment sizes are.
      for (const Elf64_Phdr& load : headers)
        if (load.p_type == PT_LOAD && relro.p_vaddr >= load.p_vaddr &&
            relro.p_vaddr < load.p_vaddr + load.p_memsz)
          relro.p_memsz = load.p_vaddr + load.p_memsz - relro.p_vaddr + 0x7c00;
      f.seekp(static_cast<std::streamoff>(eh.e_phoff + i * sizeof(Elf64_Phdr)));
      f.write(reinterpret_cast<const char*>(&relro), sizeof relro);
      patched = true;
    }
    BOOST_REQUIRE(patched);
  }
  const std::string why = "has an ELF GNU_RELRO segment that reaches outside its LOAD segment";
  const Result check = run(plugins + " check --plugin-dir " + tmp.path.string());
  BOOST_TEST(check.code != 0, check.output);
  BOOST_TEST(check.output.find(file.string() + ": " + why) != std::string::npos, check.output);
  const Result train_run = run(tiny + " --steps 2 --scaler " + file.string());
  BOOST_TEST(train_run.code == 3, train_run.output);
  BOOST_TEST(train_run.output.find(why) != std::string::npos, train_run.output);
  BOOST_TEST(count_newlines(train_run.output) == 1u, train_run.output);
}

BOOST_AUTO_TEST_CASE(ampkit_plugins_flags_misnamed_and_incompatible_files) {
  TempDir tmp;
  fs::copy_file(fs::path(ampkit::test::broken_dir()) / "wrong_kind" / "libampkit-scaler-wrong_kind.so",
                tmp.path / "libampkit-scaler-renamed.so");
  const Result renamed = run(plugins + " check --plugin-dir " + tmp.path.string());
  BOOST_TEST_INFO(renamed.output);
  BOOST_TEST(renamed.code == 8);
  BOOST_TEST(renamed.output.find("the file name disagrees with its metadata (scaler 'wrong_kind'): expected "
                                 "libampkit-scaler-wrong_kind.so") != std::string::npos);
  const std::string broken = std::string(ampkit::test::broken_dir()) + "/layout_changed";
  const Result list = run(plugins + " list --plugin-dir " + broken);
  BOOST_TEST_INFO(list.output);
  BOOST_TEST(list.output.find("Test plugin built against an edited StepStats  [incompatible]") !=
             std::string::npos);
  const auto json = nlohmann::json::parse(run(plugins + " list --json --plugin-dir " + broken).output);
  bool marked = false;
  for (const auto& p : json["plugins"])
    if (p["name"] == "layout_changed")
      marked = p["compatible"] == false &&
               p["problem"].get<std::string>().find("another layout of StepStats") != std::string::npos;
  BOOST_TEST(marked);

  // An untrusted (group-writable) file: list marks it, and a run that allows it says so in the
  // summary's warnings, not only on stderr.
  TempDir loose;
  const fs::path file = loose.path / "libampkit-scaler-loose.so";
  fs::copy_file(std::string(ampkit::test::broken_dir()) + "/wrong_kind/libampkit-scaler-wrong_kind.so", file);
  fs::permissions(file, fs::perms::group_write, fs::perm_options::add);
  const Result untrusted = run(plugins + " list --plugin-dir " + loose.path.string());
  BOOST_TEST(untrusted.output.find("[untrusted]") != std::string::npos, untrusted.output);
  const auto listed =
      nlohmann::json::parse(run(plugins + " list --json --plugin-dir " + loose.path.string()).output);
  bool untrusted_field = false;
  for (const auto& p : listed["plugins"])
    if (p["path"] == file.string()) untrusted_field = p["trusted"] == false && p.contains("untrusted");
  BOOST_TEST(untrusted_field);
  const Result allowed = run(tiny + " --steps 2 --allow-untrusted-plugins --scaler " + file.string() +
                             " --summary " + (loose.path / "s.json").string());
  BOOST_TEST_INFO(allowed.output);
  BOOST_TEST(allowed.code == 0);
  // Two folders offering scaler 'duplicate': both marked, each naming the other in --json.
  const std::string dup = std::string(ampkit::test::broken_dir()) + "/duplicate";
  const std::string both = " --plugin-dir " + dup + "/first --plugin-dir " + dup + "/second";
  const Result clash = run(plugins + " list" + both);
  size_t marks = 0;
  for (size_t at = clash.output.find("[clash]"); at != std::string::npos;
       at = clash.output.find("[clash]", at + 1))
    ++marks;
  BOOST_TEST(marks == 2u, clash.output);
  const auto clash_json = nlohmann::json::parse(run(plugins + " list --json" + both).output);
  for (const auto& p : clash_json["plugins"])
    if (p["name"] == "duplicate") BOOST_TEST(p["clash"].size() == 1u);
  // check creates each strategy in its child: a crash or an exit() there is said to be there.
  const Result faults =
      run(plugins + " check --plugin-dir " + std::string(ampkit::test::broken_dir()) + "/faults");
  BOOST_TEST(faults.code == 8);
  BOOST_TEST(faults.output.find("create_segv.so crashed while creating its strategy (signal 11") !=
                 std::string::npos,
             faults.output);
  BOOST_TEST(faults.output.find("create_exit.so ended the process (exit 0) while creating its strategy") !=
             std::string::npos);
  // check fails them too (ampkit-train refuses the name), naming the other file.
  const Result clash_check = run(plugins + " check" + both);
  BOOST_TEST(clash_check.code == 8);
  BOOST_TEST(clash_check.output.find("another file offers scaler 'duplicate' too (") != std::string::npos,
             clash_check.output);
  const auto summary = read_json(loose.path / "s.json");
  BOOST_TEST_REQUIRE(summary["warnings"].size() == 1u);
  BOOST_TEST(summary["warnings"][0].get<std::string>().find("loading untrusted plugin " + file.string()) !=
             std::string::npos);
}

// A write that fails mid-run (here a file-size limit, as a full disk) stops the run with one line
// and exit 9 (output), and the summary of an earlier run is left as it was, not emptied.
BOOST_AUTO_TEST_CASE(a_full_disk_stops_the_run_with_exit_9_and_keeps_the_previous_summary) {
  TempDir tmp;
  const fs::path summary = tmp.path / "s.json", metrics = tmp.path / "m.jsonl";
  std::ofstream(summary) << "previous\n";
  const Result r = run("bash -c \"trap '' XFSZ; ulimit -f 1; exec " + tiny + " --steps 50 --metrics " +
                       metrics.string() + " --summary " + summary.string() + "\"");
  BOOST_TEST_INFO(r.output);
  BOOST_TEST(r.code == 9);
  BOOST_TEST(r.output.find("cannot write metrics file " + metrics.string() + " (disk full?)") !=
             std::string::npos);
  // In the instrumented build (tools/test.sh --instrumented) gcov's runtime hits the same limit
  // writing its .gcda files at exit, one "libgcov profiling error:" line each: not ampkit's output.
  std::string ours;
  std::istringstream all(r.output);
  for (std::string line; std::getline(all, line);)
    if (line.rfind("libgcov profiling error:", 0) != 0) ours += line + "\n";
  BOOST_TEST(count_newlines(ours) == 1u);
  std::ifstream in(summary);
  std::string first;
  std::getline(in, first);
  BOOST_TEST(first == "previous");
}

BOOST_AUTO_TEST_CASE(broken_plugins_give_one_line_and_exit_3_never_a_crash) {
  const std::string broken = ampkit::test::broken_dir();
  struct Case {
    std::string selector;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--scaler " + broken + "/not_elf/libampkit-scaler-notelf.so", "is not an ELF shared library"},
      {"--scaler " + broken + "/no_entry/libampkit-scaler-noentry.so", "has no ampkit plugin entry"},
      {"--scaler " + broken + "/abi_newer/libampkit-scaler-abi_newer.so",
       "plugin file " + broken + "/abi_newer/libampkit-scaler-abi_newer.so was built for ampkit ABI " +
           std::to_string(AMPKIT_ABI_VERSION + 1) + " / torch " AMPKIT_TORCH_VERSION ", host has ABI " +
           std::to_string(AMPKIT_ABI_VERSION) +
           " / torch " AMPKIT_TORCH_VERSION "; rebuild the plugin against this ampkit SDK"},
      {"--scaler " + broken + "/abi_older/libampkit-scaler-abi_older.so",
       "was built for ampkit ABI " + std::to_string(AMPKIT_ABI_VERSION - 1) +
           " / torch " AMPKIT_TORCH_VERSION ", host has ABI " + std::to_string(AMPKIT_ABI_VERSION) +
           " / torch " AMPKIT_TORCH_VERSION},
      {"--scaler " + broken + "/torch_mismatch/libampkit-scaler-torch_mismatch.so", "torch 2.10.0"},
      {"--clipper " + broken + "/wrong_kind/libampkit-scaler-wrong_kind.so", "not a clipper plugin"},
      {"--scaler " + broken + "/layout_changed/libampkit-scaler-layout_changed.so",
       "was built with another layout of StepStats"},
      {"--scaler " + broken + "/throwing_factory/libampkit-scaler-throwing_factory.so",
       "could not be created"},
      {"--scaler " + broken + "/static_init_crash/libampkit-scaler-static_init_crash.so",
       "crashed while loading (signal 11"},
      // Faults inside the plugin's own code after loading: named, with the call (plugin_call.h).
      {"--scaler " + broken + "/faults/libampkit-scaler-create_segv.so",
       "scaler 'create_segv' 0.1.0 (" + broken +
           "/faults/libampkit-scaler-create_segv.so) crashed (SIGSEGV, invalid memory access) in its "
           "constructor; "
           "the run stops"},
      {"--scaler " + broken + "/faults/libampkit-scaler-update_segv.so",
       "crashed (SIGSEGV, invalid memory access) in update(); the run stops"},
      {"--scaler " + broken + "/faults/libampkit-scaler-create_exit.so", "called exit() in its constructor"},
      // _exit() runs no atexit hook: ampkit-train's own exported _exit reports it (main.cpp).
      {"--scaler " + broken + "/faults/os_exit/libampkit-scaler-create_os_exit.so",
       "scaler 'create_os_exit' 0.1.0 (" + broken +
           "/faults/os_exit/libampkit-scaler-create_os_exit.so) called _exit() in its constructor; the run "
           "stops"},
      {"--plugin-timeout 1 --scaler " + broken + "/faults/hang/libampkit-scaler-create_hang.so",
       "did not return (time limit reached) in its constructor"},
      {"--plugin-dir " + broken + "/duplicate/first --plugin-dir " + broken +
           "/duplicate/second --scaler duplicate",
       "two plugins offer scaler 'duplicate': " + broken +
           "/duplicate/first/libampkit-scaler-duplicate.so and " + broken +
           "/duplicate/second/libampkit-scaler-duplicate.so"},
  };
  for (const auto& c : cases) {
    const Result r = run(tiny + " --steps 2 " + c.selector);
    BOOST_TEST_CONTEXT(c.selector << " ->\n" << r.output) {
      BOOST_TEST(r.code == 3);
      BOOST_TEST(r.output.find(c.message) != std::string::npos);
      BOOST_TEST(count_newlines(r.output) == 1u);
    }
  }
  // Selected by name, a broken file with the plugin's file name is named with its problem.
  const Result named = run(tiny + " --steps 2 --plugin-dir " + broken + "/not_elf --scaler notelf");
  BOOST_TEST(named.code == 3);
  BOOST_TEST(named.output.find("unknown scaler 'notelf'; plugin file " + broken +
                               "/not_elf/libampkit-scaler-notelf.so: is not an ELF shared library") !=
             std::string::npos);
  // A stripped plugin is still a plugin.
  const Result stripped =
      run(tiny + " --steps 2 --scaler " + broken + "/stripped/libampkit-scaler-stripped.so");
  BOOST_TEST_INFO(stripped.output);
  BOOST_TEST(stripped.code == 0);
  // check survives a crashing plugin and reports it; list does not run it at all.
  const Result check = run(plugins + " check --plugin-dir " + broken + "/static_init_crash");
  BOOST_TEST_INFO(check.output);
  BOOST_TEST(check.code == 8);
  BOOST_TEST(check.output.find("CRASH  scaler 'static_init_crash'") != std::string::npos);
  BOOST_TEST(check.output.find(" checked, 1 failed") != std::string::npos);
  const Result list = run(plugins + " list --plugin-dir " + broken + "/static_init_crash");
  BOOST_TEST(list.code == 0);
  BOOST_TEST(list.output.find("static_init_crash") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(precision_mismatches_are_reported_once_each) {
  TempDir tmp;
  const Result fp16 =
      run(tiny +
          " --precision fp16 --scaler none --steps 2 --clipper norm --opt clipper.max_norm=10 "
          "--summary " +
          (tmp.path / "s.json").string());
  BOOST_TEST_INFO(fp16.output);
  BOOST_REQUIRE(fp16.code == 0);
  BOOST_TEST(fp16.output.find("ampkit-train: warning: --precision fp16 with scaler 'none' (scale 1): "
                              "gradients below 6e-8 underflow") != std::string::npos);
  BOOST_TEST(fp16.output.find("ampkit-train: note: clipper.max_norm=10 is the usual fp32 starting point") !=
             std::string::npos);
  BOOST_TEST(fp16.output.find("ampkit-train: warning: measured at step 0: ") != std::string::npos);
  const auto s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["warnings"].size() == 3u);
  // A static scale in fp16, and bf16 without a scaler, are what users should do: no warnings.
  for (const std::string args :
       {"--precision fp16 --scaler static", "--precision bf16",
        "--precision fp16 --scaler static --clipper norm --opt clipper.max_norm=1"}) {
    const Result quiet = run(tiny + " --steps 2 " + args);
    BOOST_TEST_CONTEXT(args << "\n" << quiet.output) {
      BOOST_TEST(quiet.code == 0);
      BOOST_TEST(quiet.output.find("ampkit-train: warning") == std::string::npos);
      BOOST_TEST(quiet.output.find("warnings             []") != std::string::npos);
      BOOST_TEST(without_cpu_note(quiet.output).find("ampkit-train: note") == std::string::npos);
    }
  }
}

// fp16 gets the dynamic scaler unless one is named, as every anchor (torch.amp, Lightning's
// 16-mixed, Accelerate, DeepSpeed) scales fp16 by default.
BOOST_AUTO_TEST_CASE(fp16_defaults_to_the_dynamic_scaler_and_print_config_says_why) {
  TempDir tmp;
  const Result r = run(tiny + " --precision fp16 --steps 2 --summary " + (tmp.path / "s.json").string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  BOOST_TEST(r.output.find("with scaler 'none'") == std::string::npos, r.output);
  const auto s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["plugins"]["scaler"]["name"] == "dynamic");
  const Result printed = run(tiny + " --precision fp16 --print-config");
  BOOST_TEST(printed.output.find("dynamic                       (default for fp16)") != std::string::npos,
             printed.output);
  // An explicit choice wins, and other precisions keep none.
  for (const auto& [args, scaler] :
       std::vector<std::pair<std::string, std::string>>{{"--precision fp16 --scaler static", "static"},
                                                        {"--precision bf16", "none"},
                                                        {"--precision fp32", "none"}}) {
    const Result other = run(tiny + " " + args + " --print-config");
    BOOST_TEST_CONTEXT(args) {
      BOOST_TEST(other.code == 0);
      BOOST_TEST(other.output.find("scaler                   " + scaler) != std::string::npos, other.output);
    }
  }
}

// Every strategy call is a plugin call, after construction too (save(), load(), update(),
// decide(), a plugin's own thread, a static initializer only the host runs): a crash, an exit(),
// a hang or an exception ends the run with one line naming the plugin and the call, exit 3,
// within --plugin-timeout + 30 s (a watchdog thread, which a plugin cannot block as it could
// block SIGALRM).
BOOST_AUTO_TEST_CASE(plugin_faults_after_construction_name_the_plugin_and_exit_3) {
  const std::string after = std::string(ampkit::test::broken_dir()) + "/after/";
  const auto scaler = [&](const std::string& name) {
    return " --scaler " + after + name + "/libampkit-scaler-" + name + ".so";
  };
  TempDir tmp;
  struct Case {
    std::string args, message, steps = "3";  // threads crash after 0.3 s: a run that lasts
  };
  const std::vector<Case> cases = {
      {scaler("save_segv") + " --checkpoint-dir " + (tmp.path / "save").string(),
       "scaler 'save_segv' 0.1.0 (" + after +
           "save_segv/libampkit-scaler-save_segv.so) crashed (SIGSEGV, "
           "invalid memory access) in save(); the run stops"},
      {scaler("update_throw"),
       "scaler 'update_throw' 0.1.0 (" + after +
           "update_throw/libampkit-scaler-update_throw.so) failed in update(): the faulty "
           "scaler gave up"},
      {scaler("update_throw_int"), "threw something that is not a std::exception in update()"},
      // The probe child's "terminate called after throwing an instance of 'int'" stays out of the
      // output. (The int is caught in the child, or, in the instrumented build, ends it with
      // SIGABRT: either way one line naming the file.)
      {scaler("init_throw_int"),
       "plugin file " + after + "init_throw_int/libampkit-scaler-init_throw_int.so"},
      {scaler("host_init_segv"),
       "crashed (SIGSEGV, invalid memory access) in its static initializers (while being "
       "loaded); the run stops"},
      {" --plugin-timeout 2" + scaler("update_hang"), "did not return (time limit reached) in update()"},
      {" --plugin-timeout 2 --nan-policy " + after + "decide_hang/libampkit-nan_policy-decide_hang.so",
       "nan_policy 'decide_hang' 0.1.0 (" + after +
           "decide_hang/libampkit-nan_policy-decide_hang.so) did not return (time limit reached) in "
           "decide()"},
      {scaler("thread_segv"),
       "error: crashed (SIGSEGV, invalid memory access) outside any plugin call (in a plugin's own thread, "
       "or "
       "in ampkit itself); plugins loaded: scaler 'thread_segv' 0.1.0",
       "1000000"},
      {scaler("thread_exit"),
       "error: exit() was called outside any plugin call (in a plugin's own thread, or in ampkit itself); "
       "plugins loaded: scaler 'thread_exit' 0.1.0",
       "1000000"},
  };
  for (const auto& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    const Result r = run("timeout 120 " + tiny + " --steps " + c.steps + c.args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_CONTEXT(c.args << " ->\n" << r.output) {
      BOOST_TEST(r.code == 3);
      BOOST_TEST(r.output.find(c.message) != std::string::npos);
      BOOST_TEST(count_newlines(r.output) == 1u);
      BOOST_TEST(seconds < 32.0);
    }
  }
  // load() crashes on resume, after a first run saved its state.
  const std::string ckpt = " --checkpoint-dir " + (tmp.path / "load").string();
  BOOST_REQUIRE(run(tiny + " --steps 2" + scaler("load_segv") + ckpt).code == 0);
  const Result load = run(tiny + " --steps 4 --resume auto" + scaler("load_segv") + ckpt);
  BOOST_TEST(load.code == 3, load.output);
  BOOST_TEST(load.output.find("crashed (SIGSEGV, invalid memory access) in load(); the run stops") !=
                 std::string::npos,
             load.output);
  BOOST_TEST(count_newlines(load.output) == 1u, load.output);
}

// A second SIGTERM while a plugin call hangs exits 130 at once, as the docs promise, and the
// plugin is not blamed for the host's own exit.
BOOST_AUTO_TEST_CASE(a_second_signal_during_a_hanging_plugin_call_exits_130) {
  TempDir tmp;
  const std::string library =
      std::string(ampkit::test::broken_dir()) + "/after/update_hang/libampkit-scaler-update_hang.so";
  std::vector<std::string> args = {train,        "--workload", "synthetic", "--threads", "1",
                                   "--progress", "never",      "--steps",   "3",         "--plugin-timeout",
                                   "600",        "--scaler",   library};
  const pid_t pid = spawn(args, tmp.path / "log");
  std::this_thread::sleep_for(std::chrono::seconds(2));  // in update() of step 1 by now
  BOOST_REQUIRE(running(pid));
  ::kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  const int code = wait_exit_code(pid);
  BOOST_TEST(code == 130);
  BOOST_TEST(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 5.0);
  std::ifstream in(tmp.path / "log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST(log.find("update_hang") == std::string::npos, log);
}

BOOST_AUTO_TEST_CASE(bf16_and_fp16_on_a_cpu_without_fast_matmuls_are_noted_once) {
  const CpuCapabilities here = cpu_capabilities();
  for (const Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    const std::string name = ampkit::to_string(precision);
    const Result r = run(tiny + " --steps 1 --scaler static --precision " + name);
    BOOST_TEST_CONTEXT(name << "\n" << r.output) {
      BOOST_TEST(r.code == 0);
      const std::string note = cpu_precision_note(precision, here);
      const size_t at = r.output.find("ampkit-train: note: this CPU");
      if (note.empty()) {
        BOOST_TEST(at == std::string::npos);
      } else {
        BOOST_TEST(r.output.find("ampkit-train: " + note + "\n") != std::string::npos);
        BOOST_TEST(r.output.find("ampkit-train: note: this CPU", at + 1) == std::string::npos);
      }
    }
  }
  BOOST_TEST(cpu_precision_note(Precision::fp32, here).empty());
}

BOOST_AUTO_TEST_CASE(char_gpt_trains_on_the_fortunes_corpus_and_reports_perplexity) {
  TempDir tmp;
  const Result r = run(train +
                       " --workload char-gpt --gpt-width 32 --gpt-layers 1 --gpt-heads 2 --gpt-context 16 "
                       "--batch-size 8 --steps 40 --lr 3e-3 --eval-batches 2 --progress never --summary " +
                       (tmp.path / "g.json").string());
  BOOST_TEST_INFO(r.output);
  BOOST_REQUIRE(r.code == 0);
  const auto s = read_json(tmp.path / "g.json");
  // Uniform guessing over 256 bytes is perplexity 256; 40 steps must already beat it clearly.
  BOOST_TEST(s["test_perplexity"].get<double>() < 60.0);
  BOOST_TEST(s["test_perplexity"].get<double>() == std::exp(s["test_loss"].get<double>()),
             boost::test_tools::tolerance(1e-9));
  const Result bad = run(train + " --workload char-gpt --gpt-width 30 --gpt-heads 4");
  BOOST_TEST(bad.code == 2);
  BOOST_TEST(bad.output.find("--gpt-width must be a multiple of --gpt-heads") != std::string::npos);
  const Result missing = run(train + " --workload char-gpt --text-dir " + (tmp.path / "none").string());
  BOOST_TEST(missing.code == 4);
  BOOST_TEST(missing.output.find("install the Debian package fortunes") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_collapsing_dynamic_scale_stops_the_run_like_a_nan_abort) {
  TempDir tmp;
  // A scale of 1e38 overflows every fp16 step; with min_scale=init_scale the first backoff is
  // already below the floor, and on_min_scale=error stops the run.
  const Result r =
      run(tiny +
          " --precision fp16 --steps 20 --scaler dynamic --opt scaler.init_scale=1e38 "
          "--opt scaler.min_scale=1e38 --opt scaler.on_min_scale=error --opt nan_policy.max_consecutive=0 "
          "--summary " +
          (tmp.path / "s.json").string());
  BOOST_TEST_INFO(r.output);
  BOOST_TEST(r.code == 5);
  BOOST_TEST(r.output.find("ampkit-train: training aborted by scaler 'dynamic' at step 0: ") !=
             std::string::npos);
  BOOST_TEST(r.output.find("loss is probably exploding") != std::string::npos);
  const auto s = read_json(tmp.path / "s.json");
  BOOST_TEST(s["status"].get<std::string>() == "aborted");
  BOOST_TEST(s["steps"].get<int>() == 1);
}

BOOST_AUTO_TEST_CASE(a_dynamic_scaler_outside_fp16_is_reported_as_wasted_work) {
  for (const std::string precision : {"bf16", "fp32"}) {
    const Result r = run(tiny + " --steps 2 --scaler dynamic --precision " + precision);
    BOOST_TEST_CONTEXT(precision << "\n" << r.output) {
      BOOST_TEST(r.code == 0);
      BOOST_TEST(r.output.find("ampkit-train: warning: --precision " + precision +
                               " with the dynamic loss scaler 'dynamic': " +
                               (precision == "bf16" ? "bf16 has fp32's exponent range"
                                                    : "fp32 gradients do not underflow") +
                               ", so scaling only costs work; use --scaler none") != std::string::npos);
    }
  }
  const Result fp16 = run(tiny + " --steps 2 --scaler dynamic --precision fp16");
  BOOST_TEST(fp16.output.find("ampkit-train: warning") == std::string::npos);
}

// value, agc and adaptive's ceiling follow the precision as norm does (docs/gradient-clipping.md,
// "Defaults per precision").
BOOST_AUTO_TEST_CASE(every_clippers_threshold_default_follows_the_precision) {
  struct Case {
    std::string clipper, option;
    std::map<std::string, std::string> value;  // precision -> default
  };
  for (const Case& c :
       std::vector<Case>{{"value", "clip_value", {{"fp16", "1"}, {"bf16", "5"}, {"fp32", "10"}}},
                         {"agc", "clip_factor", {{"fp16", "0.01"}, {"bf16", "0.05"}, {"fp32", "0.1"}}},
                         {"adaptive", "max_norm", {{"fp16", "10"}, {"bf16", "50"}, {"fp32", "100"}}}})
    for (const auto& [precision, value] : c.value) {
      const Result r =
          run(train + " --precision " + precision + " --clipper " + c.clipper + " --print-config");
      BOOST_TEST_CONTEXT(c.clipper << " " << precision << "\n" << r.output) {
        BOOST_TEST(r.code == 0);
        const auto w = words_of_line(r.output, "    " + c.option + " ");
        BOOST_TEST_REQUIRE(w.size() >= 8u);
        BOOST_TEST(w[4] == value);
        BOOST_TEST(w[5] + " " + w[6] + " " + w[7] == "default for " + precision);
      }
    }
}

BOOST_AUTO_TEST_CASE(max_norm_default_follows_the_precision_and_is_printed_with_its_source) {
  // --print-config: "    max_norm  float > 0  1  default for fp16  help..."
  for (const auto& [precision, value] :
       std::vector<std::pair<std::string, std::string>>{{"fp16", "1"}, {"bf16", "5"}, {"fp32", "10"}}) {
    const Result r = run(train + " --precision " + precision + " --clipper norm --print-config");
    BOOST_TEST_CONTEXT(precision << "\n" << r.output) {
      BOOST_TEST(r.code == 0);
      const auto w = words_of_line(r.output, "    max_norm ");
      BOOST_TEST_REQUIRE(w.size() >= 8u);
      BOOST_TEST(w[4] == value);
      BOOST_TEST(w[5] + " " + w[6] + " " + w[7] == "default for " + precision);
      BOOST_TEST(r.output.find("(unset)") == std::string::npos);
    }
  }
  // An explicit value wins over the precision's default, from any source.
  const Result cli =
      run(train + " --precision fp16 --clipper norm --opt clipper.max_norm=2.5 --print-config");
  BOOST_TEST_INFO(cli.output);
  const auto w = words_of_line(cli.output, "    max_norm ");
  BOOST_TEST_REQUIRE(w.size() >= 7u);
  BOOST_TEST(w[4] == "2.5");
  BOOST_TEST(w[5] + " " + w[6] == "command line");
  const Result env =
      run("AMPKIT_CLIPPER_MAX_NORM=7 " + train + " --precision bf16 --clipper norm --print-config");
  BOOST_TEST(words_of_line(env.output, "    max_norm ").at(4) == "7");
  BOOST_TEST(env.output.find("environment AMPKIT_CLIPPER_MAX_NORM") != std::string::npos);
  // show and --help list all three defaults; --json maps precision -> value.
  const Result show = run(plugins + " show norm");
  BOOST_TEST_INFO(show.output);
  BOOST_TEST(show.code == 0);
  BOOST_TEST(words_of_line(show.output, "    max_norm ").at(4) == "fp16=1;bf16=5;fp32=10");
  const auto json = nlohmann::json::parse(run(plugins + " show norm --json").output);
  const auto& max_norm = json["options"][0];
  BOOST_TEST(max_norm["name"].get<std::string>() == "max_norm");
  BOOST_TEST(max_norm["default"].is_null());
  BOOST_TEST(max_norm["default_per_precision"]["fp16"].get<std::string>() == "1");
  BOOST_TEST(max_norm["default_per_precision"]["bf16"].get<std::string>() == "5");
  BOOST_TEST(max_norm["default_per_precision"]["fp32"].get<std::string>() == "10");
  const Result help = run(train + " --clipper norm --help");
  BOOST_TEST(help.code == 0);
  BOOST_TEST(words_of_line(help.output, "    max_norm ").at(4) == "fp16=1;bf16=5;fp32=10");
  // The default is not mistaken for a user's fp32-style choice in an fp16 run: no note.
  const Result fp16 = run(tiny + " --precision fp16 --scaler static --clipper norm --steps 2");
  BOOST_TEST_INFO(fp16.output);
  BOOST_TEST(fp16.code == 0);
  BOOST_TEST(without_cpu_note(fp16.output).find("ampkit-train: note") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(metrics_name_the_layers_with_the_largest_gradients_and_the_csv_has_them_all) {
  TempDir tmp;
  const int steps = 6;
  const Result r =
      run(tiny + " --steps " + std::to_string(steps) + " --metrics " + (tmp.path / "m.jsonl").string() +
          " --layer-norms " + (tmp.path / "layers" / "norms.csv").string());
  BOOST_TEST_INFO(r.output);
  BOOST_REQUIRE(r.code == 0);
  // --synthetic-depth 2: three Linear layers.
  const std::vector<std::string> names = {"layers.0.weight", "layers.0.bias",   "layers.1.weight",
                                          "layers.1.bias",   "layers.2.weight", "layers.2.bias"};
  // CSV: header, then one row per parameter per step, parameters in model order.
  std::ifstream csv(tmp.path / "layers" / "norms.csv");
  std::string line;
  std::getline(csv, line);
  BOOST_TEST(line == "step,name,grad_norm");
  std::vector<double> sum_squares(steps, 0.0);
  std::vector<std::map<std::string, double>> norms(steps);
  size_t rows = 0;
  while (std::getline(csv, line)) {
    const auto c1 = line.find(','), c2 = line.rfind(',');
    BOOST_REQUIRE(c1 != std::string::npos && c2 > c1);
    const int step = std::stoi(line.substr(0, c1));
    const std::string name = line.substr(c1 + 1, c2 - c1 - 1);
    const double norm = std::stod(line.substr(c2 + 1));
    BOOST_REQUIRE(step >= 0 && step < steps);
    BOOST_TEST(name == names[rows % names.size()]);
    BOOST_TEST(step == static_cast<int>(rows / names.size()));
    sum_squares[step] += norm * norm;
    norms[step][name] = norm;
    ++rows;
  }
  BOOST_TEST(rows == steps * names.size());
  // JSONL: "top_layers" holds the 3 (default) largest, sorted, real names, matching the CSV; the
  // CSV's norms add up (root-sum-square) to the record's grad_norm.
  std::ifstream metrics(tmp.path / "m.jsonl");
  int n = 0;
  while (std::getline(metrics, line)) {
    const auto rec = nlohmann::json::parse(line);
    const int step = rec["step"].get<int>();
    BOOST_TEST_CONTEXT("step " << step) {
      BOOST_TEST(std::sqrt(sum_squares[step]) == rec["grad_norm"].get<double>(),
                 boost::test_tools::tolerance(1e-6));
      const auto& top = rec["top_layers"];
      BOOST_TEST_REQUIRE(top.size() == 3u);
      double previous = INFINITY;
      for (const auto& entry : top) {
        const std::string name = entry["name"].get<std::string>();
        const double norm = entry["grad_norm"].get<double>();
        BOOST_TEST((std::find(names.begin(), names.end(), name) != names.end()), name);
        BOOST_TEST(norm <= previous);
        BOOST_TEST(norm == norms[step][name], boost::test_tools::tolerance(1e-12));
        previous = norm;
      }
      // Nothing left out is larger than the smallest listed.
      for (const auto& [name, norm] : norms[step]) {
        bool listed = false;
        for (const auto& entry : top) listed = listed || entry["name"].get<std::string>() == name;
        if (!listed) BOOST_TEST(norm <= previous);
      }
    }
    ++n;
  }
  BOOST_TEST(n == steps);
  // K is adjustable, 0 turns the field off, and a bad K is a usage error.
  const Result k5 =
      run(tiny + " --steps 1 --layer-norms-top-k 5 --metrics " + (tmp.path / "k5.jsonl").string());
  BOOST_REQUIRE(k5.code == 0);
  {
    std::ifstream in(tmp.path / "k5.jsonl");
    std::getline(in, line);
  }
  BOOST_TEST(nlohmann::json::parse(line)["top_layers"].size() == 5u);
  const Result k0 =
      run(tiny + " --steps 1 --layer-norms-top-k 0 --metrics " + (tmp.path / "k0.jsonl").string());
  BOOST_REQUIRE(k0.code == 0);
  {
    std::ifstream in(tmp.path / "k0.jsonl");
    std::getline(in, line);
  }
  BOOST_TEST(!nlohmann::json::parse(line).contains("top_layers"));
  const Result bad = run(tiny + " --steps 1 --layer-norms-top-k -1");
  BOOST_TEST(bad.code == 2);
  BOOST_TEST(bad.output.find("--layer-norms-top-k must be in [0, 1000000], got -1") != std::string::npos);
  BOOST_TEST(count_newlines(bad.output) == 1u);
}

BOOST_AUTO_TEST_CASE(a_resumed_run_keeps_one_metrics_record_per_step) {
  TempDir tmp;
  const std::string base = tiny + " --checkpoint-dir " + (tmp.path / "ckpt").string() + " --metrics " +
                           (tmp.path / "m.jsonl").string() + " --layer-norms " +
                           (tmp.path / "l.csv").string();
  BOOST_REQUIRE(run(base + " --steps 20 --checkpoint-every 10").code == 0);
  // Resume from step 10 as if the run had died after it: steps 10..19 are run again.
  fs::remove_all(tmp.path / "ckpt" / "step-20");
  std::ofstream(tmp.path / "ckpt" / "latest", std::ios::trunc) << "step-10";
  const Result r = run(base + " --steps 30 --resume auto");
  BOOST_TEST_INFO(r.output);
  BOOST_REQUIRE(r.code == 0);
  BOOST_TEST(r.output.find("resumed from") != std::string::npos);
  std::ifstream metrics(tmp.path / "m.jsonl");
  std::string line;
  std::vector<int> steps;
  while (std::getline(metrics, line)) steps.push_back(nlohmann::json::parse(line)["step"].get<int>());
  std::vector<int> expected(30);
  for (int i = 0; i < 30; ++i) expected[i] = i;
  BOOST_TEST(steps == expected, boost::test_tools::per_element());
  std::ifstream csv(tmp.path / "l.csv");
  std::getline(csv, line);
  BOOST_TEST(line == "step,name,grad_norm");
  size_t rows = 0;
  while (std::getline(csv, line)) ++rows;
  BOOST_TEST(rows % 30 == 0u);
  BOOST_TEST(rows > 0u);
}
