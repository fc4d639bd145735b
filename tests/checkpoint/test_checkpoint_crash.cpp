// Crash safety: SIGKILL ampkit-train at random moments while it writes a checkpoint every step;
// afterwards --resume auto always finds a checkpoint that passes its checksums, or none yet.
#define BOOST_TEST_MODULE checkpoint_crash
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <random>
#include <thread>

#include "ampkit/checkpoint.h"
#include "train_process.h"

using namespace ampkit::test;

BOOST_AUTO_TEST_CASE(sigkill_at_random_moments_never_leaves_a_corrupt_latest_checkpoint) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  std::vector<std::string> argv = {train};
  for (const auto& w :
       words(tiny_args + " --steps 100000000 --checkpoint-every 1 --keep-checkpoints 2 --resume auto"))
    argv.push_back(w);
  argv.push_back("--checkpoint-dir");
  argv.push_back(dir.string());

  // Calibrate: the time from start to the first checkpoint, so kills spread over start-up and
  // a stretch of writing checkpoints (most of each step's time is the checkpoint's fsyncs).
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = spawn(argv, tmp.path / "log.txt");
  while (!fs::exists(dir / "latest") && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto first_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  ::kill(pid, SIGKILL);
  wait_exit_code(pid);
  BOOST_REQUIRE_MESSAGE(fs::exists(dir / "latest"), "no checkpoint within 60 s");
  BOOST_TEST_MESSAGE("first checkpoint after " << first_ms << " ms");
  fs::remove_all(dir);

  // One kill in five lands anywhere from start-up on; the others wait for the trainer to finish
  // a new checkpoint, then kill it 0..30 ms later, in the middle of writing the next one.
  const int trials = 50;
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> early(0, static_cast<int>(first_ms)), late(0, 30), pick(0, 4);
  int with_checkpoint = 0, killed_running = 0, killed_while_writing = 0, torn_writes = 0;
  bool seen_valid = false;
  int64_t last_step = -1;
  auto read_latest = [&]() {
    std::ifstream in(dir / "latest");
    std::string line;
    std::getline(in, line);
    return line;
  };
  for (int trial = 0; trial < trials; ++trial) {
    const std::string before = read_latest();
    pid = spawn(argv, tmp.path / "log.txt");
    if (pick(rng) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(early(rng)));
    } else {
      const auto start = std::chrono::steady_clock::now();
      while (read_latest() == before && std::chrono::steady_clock::now() - start < std::chrono::seconds(30))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(late(rng)));
      ++killed_while_writing;
    }
    ::kill(pid, SIGKILL);
    const int code = wait_exit_code(pid);
    killed_running += code == 128 + SIGKILL;
    // A temporary left behind is a checkpoint (or `latest`) the kill tore mid-write.
    bool torn = fs::exists(dir / "latest.tmp");
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      torn |= e.path().filename().string().rfind(".tmp-step-", 0) == 0;
    torn_writes += torn;
    std::vector<std::string> warnings;
    const auto found = ampkit::find_resume_checkpoint(dir, &warnings);
    BOOST_TEST_CONTEXT("trial " << trial) {
      // step-N folders appear only by rename of a complete one: nothing corrupt is ever visible.
      BOOST_TEST(warnings.empty(), (warnings.empty() ? "" : warnings.front()));
      if (seen_valid) BOOST_TEST(found.has_value());  // a valid checkpoint never disappears
      if (found) {
        ++with_checkpoint;
        seen_valid = true;
        const auto m = ampkit::read_checkpoint(*found).manifest;
        BOOST_TEST(m.steps_attempted >= last_step);  // progress is never lost
        last_step = m.steps_attempted;
        BOOST_TEST(fs::exists(dir / "latest"));
      }
    }
  }
  BOOST_TEST_MESSAGE(trials << " kills, " << killed_while_writing << " of them after a new checkpoint; "
                            << torn_writes << " tore a write; " << killed_running
                            << " hit a running trainer; " << with_checkpoint
                            << " left a valid checkpoint; last step " << last_step);
  BOOST_TEST(killed_running >= trials / 2);
  BOOST_TEST(with_checkpoint >= killed_while_writing);
  BOOST_TEST(killed_while_writing >= trials / 2);

  // The CLI agrees: --resume auto resumes (or starts fresh) without an error.
  Result r = run(train + " " + tiny_args + " --steps " + std::to_string(last_step + 2) +
                 " --resume auto --checkpoint-dir " + dir.string());
  BOOST_TEST(r.code == 0, r.output);
  BOOST_TEST(r.output.find(last_step >= 0 ? "resumed from" : "starting fresh") != std::string::npos,
             r.output);
  // Temporaries of killed writers are cleaned up by the next writer: at most one is left.
  int temporaries = 0;
  for (const auto& e : fs::directory_iterator(dir)) temporaries += e.path().filename().string()[0] == '.';
  BOOST_TEST(temporaries == 0);
}
