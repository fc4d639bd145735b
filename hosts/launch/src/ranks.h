// ampkit-launch's ranks: starting one attempt of this node's ranks with torchrun's environment,
// then supervising them (prefixed output, forwarded signals, stopping the others on a failure).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ampkit::launch {

// The longest --grace-seconds (one day): far more than any shutdown needs, and far below the
// ~292 years where seconds stop fitting steady_clock's nanoseconds (1e19 s once overflowed into
// a SIGKILL after about a second).
constexpr double kMaxGraceSeconds = 86400;

// The most ranks in a job, --nnodes x --nproc-per-node: ampkit-train's --world-size range, and
// far below where the rank numbers would overflow an int.
constexpr int kMaxWorldSize = 1 << 20;

struct LaunchOptions {
  int nproc = 1, nnodes = 1, node_rank = 0, port = 29500;
  int max_restarts = 0;
  double grace = 30.0;  // torchrun's: survivors need a few heartbeats to name a lost rank
  std::string addr;
  int split = 0;  // argv index of "--"; the program is argv[split + 1]
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of its stdout and stderr
  std::string out_line, err_line;
  bool running = true;
  int status = 0;
};

// What happened to one attempt (a start of every rank of this node).
struct AttemptResult {
  int exit_code = 0;             // the launcher's code for this attempt (0: every rank succeeded)
  int failed_rank = -1;          // the first rank that failed on its own (not after our signal)
  std::string failure;           // "was killed by signal 9 (Killed) at 12.3 s"
  bool signalled = false;        // the launcher was told to stop (SIGINT/SIGTERM/SIGHUP)
  bool could_not_start = false;  // a rank's program could not be executed
};

// The self-pipe the signal handler writes to; created by install_signal_forwarding().
bool install_signal_forwarding();

// Starts every rank of this node (restart_count goes to TORCHELASTIC_RESTART_COUNT) and
// supervises them until all have exited. `start` is the launcher's start, for the times printed.
AttemptResult run_attempt(const LaunchOptions& o, char** argv, int restart_count,
                          std::chrono::steady_clock::time_point start);

}  // namespace ampkit::launch
