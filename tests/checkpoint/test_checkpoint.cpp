// Checkpoints as a user relies on them: bit-exact resume, corruption and incompatibility caught
// with exit 6 and the file or parameter named, SIGTERM writes a checkpoint and exits 130.
#define BOOST_TEST_MODULE checkpoint
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include "ampkit/checkpoint.h"
#include "ampkit/error.h"
#include "ampkit/sha256.h"
#include "test_paths.h"
#include "train_process.h"

using namespace ampkit::test;

namespace {

bool has_plugin(const std::string& file) {
  return fs::exists(fs::path(ampkit::test::plugin_dir()) / file);
}

// The scaler with the most state available: dynamic (growth tracker, growing scale), else static.
std::string stateful_scaler() {
  return has_plugin("libampkit-scaler-dynamic.so") ? "--scaler dynamic --opt scaler.growth_interval=30"
                                                   : "--scaler static";
}

// One run of 200 steps against 100 steps + --resume auto + 100 steps: identical parameters,
// plugin states and counters.
void check_exact_resume(const std::string& precision) {
  TempDir tmp;
  const std::string common = tiny + " --precision " + precision + " --accumulate 2 " + stateful_scaler() +
                             " --clipper adaptive --seed 7";
  const fs::path straight = tmp.path / "straight", split = tmp.path / "split";
  Result a = run(common + " --steps 200 --checkpoint-dir " + straight.string() + " --summary " +
                 (tmp.path / "a.json").string());
  BOOST_REQUIRE_MESSAGE(a.code == 0, a.output);
  Result b1 = run(common + " --steps 100 --checkpoint-dir " + split.string() + " --summary " +
                  (tmp.path / "b1.json").string());
  BOOST_REQUIRE_MESSAGE(b1.code == 0, b1.output);
  BOOST_REQUIRE(fs::exists(split / "step-100" / "manifest.json"));
  Result b2 = run(common + " --steps 200 --resume auto --checkpoint-dir " + split.string() + " --summary " +
                  (tmp.path / "b2.json").string());
  BOOST_REQUIRE_MESSAGE(b2.code == 0, b2.output);
  BOOST_TEST(
      b2.output.find("resumed from " + (split / "step-100").string() + " at step 100") != std::string::npos,
      b2.output);

  const auto sa = read_json(tmp.path / "a.json"), sb1 = read_json(tmp.path / "b1.json"),
             sb2 = read_json(tmp.path / "b2.json");
  BOOST_TEST(sa["param_sha256"] == sb2["param_sha256"]);
  BOOST_TEST(sa["param_sha256"] != sb1["param_sha256"]);  // the second half did train
  BOOST_TEST(sb2["steps"] == 200);
  BOOST_TEST(sa["steps_taken"] == sb2["steps_taken"]);
  BOOST_TEST(sa["final_loss"] == sb2["final_loss"]);  // exact: the last 20 losses were restored
  BOOST_TEST(sa["clip_rate"] == sb2["clip_rate"]);

  const auto ma = ampkit::read_checkpoint(straight / "step-200").manifest;
  const auto mb = ampkit::read_checkpoint(split / "step-200").manifest;
  BOOST_TEST(ma.param_sha256 == mb.param_sha256);
  BOOST_TEST(ma.steps_attempted == 200);
  BOOST_TEST(ma.steps_taken == mb.steps_taken);
  BOOST_TEST(ma.consecutive_skips == mb.consecutive_skips);
  BOOST_TEST(ma.cpu_rng_state == mb.cpu_rng_state);
  BOOST_REQUIRE_EQUAL(ma.plugins.size(), 4u);
  BOOST_REQUIRE_EQUAL(mb.plugins.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    BOOST_TEST(ma.plugins[i].kind == mb.plugins[i].kind);
    BOOST_TEST_CONTEXT(ma.plugins[i].kind) {
      BOOST_TEST(ampkit::state_to_json(ma.plugins[i].state).dump() ==
                 ampkit::state_to_json(mb.plugins[i].state).dump());
    }
  }
  // The clipper's history is part of what was compared (adaptive keeps one).
  BOOST_TEST(!ma.plugins[1].state.empty());
}

void flip_byte(const fs::path& file, std::uintmax_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x01));
}

// A checkpoint of 20 steps of the tiny model with the static scaler and the norm clipper.
struct SavedRun {
  TempDir tmp;
  fs::path dir = tmp.path / "ckpt";
  SavedRun() {
    Result r = run(tiny + " --steps 20 --scaler static --clipper norm --checkpoint-dir " + dir.string());
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
    BOOST_REQUIRE(fs::exists(dir / "step-20"));
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(resume_is_bit_exact_fp32_accumulate_2) {
  check_exact_resume("fp32");
}

BOOST_AUTO_TEST_CASE(resume_is_bit_exact_bf16_accumulate_2) {
  check_exact_resume("bf16");
}

BOOST_AUTO_TEST_CASE(checkpoint_folder_layout_and_keep) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  Result r =
      run(tiny + " --steps 25 --checkpoint-every 5 --keep-checkpoints 2 --checkpoint-dir " + dir.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  BOOST_TEST(names == (std::vector<std::string>{"latest", "step-20", "step-25"}),
             boost::test_tools::per_element());
  std::ifstream latest(dir / "latest");
  std::string line;
  std::getline(latest, line);
  BOOST_TEST(line == "step-25");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "step-25")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  BOOST_TEST(files == (std::vector<std::string>{"manifest.json", "manifest.sha256", "model.pt",
                                                "optimizer.pt", "optimizer_state_dict.pt"}),
             boost::test_tools::per_element());
  const auto m = read_json(dir / "step-25" / "manifest.json");
  BOOST_TEST(m["step"]["attempted"] == 25);
  BOOST_TEST(m["plugins"].size() == 4u);
  BOOST_TEST(!m["config"].empty());
  BOOST_TEST(m["torch_version"] == "2.11.0");
  // `sha256sum -c manifest.sha256` works from the shell.
  Result sum = run("cd " + (dir / "step-25").string() + " && sha256sum -c manifest.sha256");
  BOOST_TEST(sum.code == 0, sum.output);
}

// An old checkpoint that cannot be deleted (once it was left as .old-step-N-PID without a
// word) is named in a warning; the run goes on and `latest` is the new one. Root ignores file
// modes, so root makes a file immutable (chattr +i); others make the folder read-only.
BOOST_AUTO_TEST_CASE(an_undeletable_old_checkpoint_is_named_in_a_warning) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  const std::string common =
      tiny + " --checkpoint-every 5 --keep-checkpoints 1 --checkpoint-dir " + dir.string();
  Result first = run(common + " --steps 5");
  BOOST_REQUIRE_MESSAGE(first.code == 0, first.output);
  const fs::path pinned = dir / "step-5" / "model.pt";
  const bool root = ::geteuid() == 0;
  const std::string lock = root ? "chattr +i " + pinned.string() : "chmod 0555 " + (dir / "step-5").string();
  if (run(lock).code != 0) {
    BOOST_TEST_MESSAGE("cannot make a file undeletable here (" + lock + " failed): nothing to check");
    return;
  }
  Result second = run(common + " --steps 10 --resume auto");
  std::string aside;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".old-step-5-", 0) == 0) aside = e.path().string();
  // Unlock first, so that the folder can be removed whatever the checks say.
  if (!aside.empty()) run(root ? "chattr -i " + aside + "/model.pt" : "chmod 0755 " + aside);
  BOOST_TEST(second.code == 0, second.output);
  BOOST_TEST_REQUIRE(!aside.empty());
  BOOST_TEST(
      second.output.find("ampkit-train: warning: could not delete the old checkpoint " +
                         (dir / "step-5").string() + " (left as " + aside + "): ") != std::string::npos,
      second.output);
  BOOST_TEST(second.output.find("; delete it by hand") != std::string::npos);
  std::ifstream latest(dir / "latest");
  std::string line;
  std::getline(latest, line);
  BOOST_TEST(line == "step-10");
}

BOOST_AUTO_TEST_CASE(a_flipped_byte_in_any_file_is_an_error_naming_that_file) {
  SavedRun saved;
  const fs::path original = saved.dir / "step-20";
  for (const std::string name : {"model.pt", "optimizer.pt", "manifest.json", "manifest.sha256"}) {
    const auto size = fs::file_size(original / name);
    for (std::uintmax_t offset : {std::uintmax_t{0}, size / 2, size - 1}) {
      BOOST_TEST_CONTEXT(name << " byte " << offset) {
        const fs::path copy = saved.tmp.path / ("copy-" + name + "-" + std::to_string(offset)) / "step-20";
        fs::create_directories(copy.parent_path());
        fs::copy(original, copy);
        flip_byte(copy / name, offset);
        try {
          ampkit::read_checkpoint(copy);
          BOOST_ERROR("a corrupt checkpoint was accepted");
        } catch (const ampkit::Error& e) {
          BOOST_TEST((e.category() == ampkit::ErrorCategory::checkpoint));
          BOOST_TEST(std::string(e.what()).find(name) != std::string::npos, e.what());
        }
        BOOST_TEST(!ampkit::find_resume_checkpoint(copy.parent_path()).has_value());
        if (offset != size / 2) continue;
        // Through the CLI: one line naming the file, exit 6.
        Result r = run(tiny + " --steps 25 --scaler static --clipper norm --resume " + copy.string());
        BOOST_TEST(r.code == 6, r.output);
        BOOST_TEST(r.output.find("error: checkpoint " + copy.string()) != std::string::npos, r.output);
        BOOST_TEST(r.output.find((copy / name).string()) != std::string::npos, r.output);
      }
    }
  }
  // --resume auto with nothing usable left refuses, naming the corrupt file, rather than start fresh.
  const fs::path corrupt_dir = saved.tmp.path / "copy-model.pt-0";
  Result r = run(tiny + " --steps 2 --scaler static --clipper norm --resume auto --checkpoint-dir " +
                 corrupt_dir.string());
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(
      r.output.find("no usable checkpoint among the 1 in " + corrupt_dir.string()) != std::string::npos,
      r.output);
  BOOST_TEST(r.output.find((corrupt_dir / "step-20" / "model.pt").string()) != std::string::npos, r.output);
  BOOST_TEST(fs::exists(corrupt_dir / "step-20" / "model.pt"));
}

BOOST_AUTO_TEST_CASE(resume_auto_falls_back_to_an_older_valid_checkpoint) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  Result r = run(tiny + " --steps 10 --checkpoint-every 5 --checkpoint-dir " + dir.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  flip_byte(dir / "step-10" / "optimizer.pt", 100);
  r = run(tiny + " --steps 12 --resume auto --checkpoint-dir " + dir.string());
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("warning: skipping the checkpoint named by latest") != std::string::npos,
             r.output);
  BOOST_TEST(r.output.find((dir / "step-10" / "optimizer.pt").string()) != std::string::npos, r.output);
  BOOST_TEST(r.output.find("resumed from " + (dir / "step-5").string() + " at step 5") != std::string::npos,
             r.output);
  // No checkpoint at all: a note and a fresh start, not an error.
  r = run(tiny + " --steps 2 --resume auto --checkpoint-dir " + (tmp.path / "empty").string());
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("no checkpoint in " + (tmp.path / "empty").string() + " yet; starting fresh") !=
                 std::string::npos,
             r.output);
}

// A FIFO or a /dev/zero link in the newest checkpoint is a corrupt checkpoint like any other (read
// as regular files only, within the manifest's sizes, it can neither block nor grow): auto falls
// back to the older one at once, and the summary says which it skipped and that the corrupt one
// was deleted when its step was written again.
BOOST_AUTO_TEST_CASE(a_fifo_or_a_device_in_the_newest_checkpoint_falls_back_with_a_summary_warning) {
  for (const std::string kind : {"fifo", "dev-zero"}) {
    BOOST_TEST_CONTEXT(kind) {
      TempDir tmp;
      const fs::path dir = tmp.path / "ckpt", summary = tmp.path / "s.json";
      Result r = run(tiny + " --steps 10 --checkpoint-every 5 --checkpoint-dir " + dir.string());
      BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
      const fs::path bad = dir / "step-10" / (kind == "fifo" ? "model.pt" : "optimizer.pt");
      fs::remove(bad);
      if (kind == "fifo")
        BOOST_REQUIRE(::mkfifo(bad.c_str(), 0644) == 0);
      else
        fs::create_symlink("/dev/zero", bad);
      const auto start = std::chrono::steady_clock::now();
      r = run("timeout 60 " + tiny + " --steps 12 --checkpoint-every 5 --resume auto --checkpoint-dir " +
              dir.string() + " --summary " + summary.string());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      BOOST_TEST(r.code == 0, r.output);
      BOOST_TEST(seconds < 60.0);
      BOOST_TEST(
          r.output.find("resumed from " + (dir / "step-5").string() + " at step 5") != std::string::npos,
          r.output);
      const auto s = read_json(summary);
      const std::string warnings = s["warnings"].dump();
      BOOST_TEST(warnings.find("skipping the checkpoint named by latest") != std::string::npos, warnings);
      BOOST_TEST(warnings.find(bad.string() + " is not a regular file") != std::string::npos, warnings);
      BOOST_TEST(
          warnings.find("deleting the corrupt checkpoint " + (dir / "step-10").string()) != std::string::npos,
          warnings);
      BOOST_TEST(ampkit::read_checkpoint(dir / "step-10").manifest.steps_attempted == 10);  // written anew
    }
  }
}

// When every checkpoint is corrupt, --resume auto refuses (exit 6, naming the folder and the
// newest's fault) rather than start over and rotate them away: nothing is deleted, and --resume
// none is the explicit fresh start.
BOOST_AUTO_TEST_CASE(resume_auto_refuses_when_every_checkpoint_is_corrupt_and_deletes_nothing) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  Result r = run(tiny + " --steps 10 --checkpoint-every 5 --checkpoint-dir " + dir.string());
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.output);
  flip_byte(dir / "step-5" / "model.pt", 100);
  flip_byte(dir / "step-10" / "model.pt", 100);
  r = run(tiny + " --steps 12 --checkpoint-every 5 --keep-checkpoints 1 --resume auto --checkpoint-dir " +
          dir.string());
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(words(r.output).size() > 0);
  BOOST_TEST(std::count(r.output.begin(), r.output.end(), '\n') == 1, r.output);
  BOOST_TEST(r.output.find("--resume auto: no usable checkpoint among the 2 in " + dir.string() +
                           " (newest: checkpoint " + (dir / "step-10").string() + ": checksum mismatch") !=
                 std::string::npos,
             r.output);
  BOOST_TEST(r.output.find("nothing was deleted") != std::string::npos, r.output);
  BOOST_TEST(fs::exists(dir / "step-5" / "model.pt"));
  BOOST_TEST(fs::exists(dir / "step-10" / "model.pt"));
  // --resume none: a fresh start on purpose; rotation then deletes the corrupt ones, saying so.
  const fs::path summary = tmp.path / "s.json";
  r = run(tiny + " --steps 15 --checkpoint-every 5 --keep-checkpoints 1 --resume none --checkpoint-dir " +
          dir.string() + " --summary " + summary.string());
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("resumed") == std::string::npos, r.output);
  const std::string warnings = read_json(summary)["warnings"].dump();
  BOOST_TEST(
      warnings.find("deleting the corrupt checkpoint " + (dir / "step-5").string()) != std::string::npos,
      warnings);
  BOOST_TEST(
      warnings.find("deleting the corrupt checkpoint " + (dir / "step-10").string()) != std::string::npos,
      warnings);
}

BOOST_AUTO_TEST_CASE(a_different_model_is_an_error_naming_the_first_differing_parameter) {
  SavedRun saved;
  const std::string model = train + " " + base_args;
  Result r =
      run(model +
          " --synthetic-depth 2 --steps 25 --scaler static --clipper norm --synthetic-width 48 --resume " +
          (saved.dir / "step-20").string());
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(
      r.output.find("was saved from a different model: parameter 'layers.0.weight' has shape [32, 16] in the "
                    "checkpoint, [48, 16] in this model") != std::string::npos,
      r.output);
  r = run(model +
          " --synthetic-width 32 --steps 25 --scaler static --clipper norm --synthetic-depth 3 --resume " +
          (saved.dir / "step-20").string());
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(r.output.find("different model") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(a_different_plugin_is_an_error_unless_weights_only) {
  SavedRun saved;
  const std::string from = " --resume " + (saved.dir / "step-20").string();
  Result r = run(tiny + " --steps 25 --scaler none --clipper norm" + from);
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(r.output.find("was written with scaler 'static'") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("this run selects scaler 'none'") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("--weights-only") != std::string::npos, r.output);
  r = run(tiny + " --steps 3 --scaler none --clipper norm --weights-only" + from);
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("(weights only)") != std::string::npos, r.output);
  // Another optimizer cannot take the saved optimizer state either.
  r = run(tiny + " --steps 25 --scaler static --clipper norm --optimizer sgd" + from);
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(r.output.find("--optimizer adamw") != std::string::npos, r.output);
}

// The manifest keeps its config as an array of {name, value, source}, as older ampkit wrote it and
// tools/golden/pytorch_interop.py reads it; one whose array is in another order (older ampkit wrote
// the option table's order) resumes, and the optimizer it names is still checked.
BOOST_AUTO_TEST_CASE(the_manifest_config_is_an_array_of_settings_read_in_any_order) {
  SavedRun saved;
  const fs::path step = saved.dir / "step-20";
  nlohmann::json m = read_json(step / "manifest.json");
  BOOST_REQUIRE(m["config"].is_array());
  bool has_optimizer = false;
  for (const auto& setting : m["config"]) {
    BOOST_TEST((setting["name"].is_string() && setting["value"].is_string() && setting["source"].is_string()),
               setting.dump());
    has_optimizer = has_optimizer || (setting["name"] == "optimizer" && setting["value"] == "adamw");
  }
  BOOST_TEST(has_optimizer);
  std::reverse(m["config"].begin(), m["config"].end());
  std::ofstream(step / "manifest.json") << m.dump(1);
  std::ofstream(step / "manifest.sha256")
      << ampkit::sha256_file(step / "manifest.json") << "  manifest.json\n";
  Result r = run(tiny + " --steps 25 --scaler static --clipper norm --resume " + step.string());
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find("resumed from") != std::string::npos, r.output);
  r = run(tiny + " --steps 25 --scaler static --clipper norm --optimizer sgd --resume " + step.string());
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(r.output.find("was written with --optimizer adamw") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(sigterm_writes_a_checkpoint_exits_130_and_resume_ends_identical) {
  TempDir tmp;
  // Big enough that 3000 steps outlast the signal, small enough for a few seconds per run.
  const std::string args =
      base_args + " --synthetic-width 64 --synthetic-depth 2 --steps 3000 --scaler static --clipper norm";
  const fs::path dir = tmp.path / "ckpt", metrics = tmp.path / "m.jsonl";
  std::vector<std::string> argv = {train};
  for (const auto& w : words(args + " --checkpoint-dir " + dir.string() + " --summary " +
                             (tmp.path / "interrupted.json").string() + " --metrics " + metrics.string()))
    argv.push_back(w);
  const pid_t pid = spawn(argv, tmp.path / "log.txt");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_lines(metrics) < 50 && running(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGTERM);
  const int code = wait_exit_code(pid);
  std::ifstream log_in(tmp.path / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  BOOST_REQUIRE_MESSAGE(code == 130, "exit " << code << ": " << log);
  BOOST_TEST(log.find("interrupted by SIGTERM") != std::string::npos, log);
  const auto s = read_json(tmp.path / "interrupted.json");
  BOOST_TEST(s["status"] == "interrupted");
  BOOST_TEST(s["interrupted_by"] == "SIGTERM");
  const int64_t stopped_at = s["steps"].get<int64_t>();
  BOOST_TEST(stopped_at >= 50);
  BOOST_TEST(stopped_at < 3000);
  BOOST_TEST(fs::exists(dir / ("step-" + std::to_string(stopped_at))));
  BOOST_TEST(ampkit::find_resume_checkpoint(dir).value() == dir / ("step-" + std::to_string(stopped_at)));

  Result resumed = run(train + " " + args + " --resume auto --checkpoint-dir " + dir.string() +
                       " --summary " + (tmp.path / "resumed.json").string());
  BOOST_REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  Result straight = run(train + " " + args + " --summary " + (tmp.path / "straight.json").string());
  BOOST_REQUIRE_MESSAGE(straight.code == 0, straight.output);
  BOOST_TEST(read_json(tmp.path / "resumed.json")["param_sha256"] ==
             read_json(tmp.path / "straight.json")["param_sha256"]);
  BOOST_TEST(read_json(tmp.path / "resumed.json")["steps"] == 3000);
}

BOOST_AUTO_TEST_CASE(bad_checkpoint_options_are_usage_errors) {
  Result r = run(tiny + " --steps 1 --resume auto");
  BOOST_TEST(r.code == 2, r.output);
  BOOST_TEST(r.output.find("--resume auto needs --checkpoint-dir") != std::string::npos, r.output);
  r = run(tiny + " --steps 1 --keep-checkpoints 0 --checkpoint-dir /tmp/x");
  BOOST_TEST(r.code == 2, r.output);
  r = run(tiny + " --steps 1 --resume /nonexistent/step-3");
  BOOST_TEST(r.code == 6, r.output);
  BOOST_TEST(r.output.find("checkpoint /nonexistent/step-3 does not exist") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(plugin_state_round_trips_exactly_through_the_manifest_json) {
  ampkit::State s;
  s.set("third", 1.0 / 3.0);
  s.set("whole", 2.0);  // stays a double, not an integer
  s.set("tracker", int64_t{7});
  s.set("on", true);
  s.set("mode", std::string("zscore"));
  s.set("history", std::vector<double>{0.1, std::nan(""), HUGE_VAL, -HUGE_VAL, 5e-324, -0.0});
  const ampkit::State back = ampkit::state_from_json(nlohmann::json::parse(ampkit::state_to_json(s).dump()));
  BOOST_TEST(back.get<double>("third") == 1.0 / 3.0);
  BOOST_TEST(back.get<double>("whole") == 2.0);
  BOOST_TEST(back.get<int64_t>("tracker") == 7);
  BOOST_TEST(back.get<bool>("on"));
  BOOST_TEST(back.get<std::string>("mode") == "zscore");
  const auto& h = back.get<std::vector<double>>("history");
  BOOST_REQUIRE_EQUAL(h.size(), 6u);
  BOOST_TEST(h[0] == 0.1);
  BOOST_TEST(std::isnan(h[1]));
  BOOST_TEST(h[2] == HUGE_VAL);
  BOOST_TEST(h[3] == -HUGE_VAL);
  BOOST_TEST(h[4] == 5e-324);
  BOOST_TEST(std::signbit(h[5]));
}
