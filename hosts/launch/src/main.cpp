// ampkit-launch: runs N ranks of a program on this node with torchrun's environment, prefixes
// their output with the rank, forwards signals, and stops every rank when one fails.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ampkit/exit_codes.h"

namespace po = boost::program_options;

namespace {

// Exit codes (docs/configuration.md): a failed rank's own code is passed on.
constexpr int kUsage = ampkit::exit_status(ampkit::ExitCode::usage);
constexpr int kLaunchFailed = ampkit::exit_status(ampkit::ExitCode::distributed);

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal_number) {
  const int saved = errno;
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of its stdout and stderr
  std::string out_line, err_line;
  bool running = true;
  int status = 0;
};

void emit(int rank, std::string& pending, const char* data, size_t n, FILE* to, bool flush_all) {
  pending.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), pending.data() + start);
  pending.erase(0, start);
  if (flush_all && !pending.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, pending.c_str());
    pending.clear();
  }
  std::fflush(to);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
           ")";
  return "stopped";
}

int exit_code_of_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kLaunchFailed;
}

struct LaunchOptions {
  int nproc = 1, nnodes = 1, node_rank = 0, port = 29500;
  double grace = 30.0;  // torchrun's: survivors need ~timeout + 5 s to name a lost rank
  std::string addr;
  int split = 0;  // argv index of "--"; the program is argv[split + 1]
};

// Parses and checks the options; returns an exit code when the launcher should stop (help, usage).
std::optional<int> parse_options(int argc, char** argv, LaunchOptions& o) {
  // Everything after "--" is the program and its arguments.
  o.split = 1;
  while (o.split < argc && std::strcmp(argv[o.split], "--") != 0) ++o.split;
  po::options_description options("usage: ampkit-launch [options] -- PROGRAM [ARGS...]\n\noptions");
  // clang-format off
  options.add_options()
    ("help,h", "Show this help.")
    ("nproc-per-node", po::value<int>(&o.nproc)->default_value(1), "Ranks to start on this node.")
    ("nnodes", po::value<int>(&o.nnodes)->default_value(1), "Nodes in the job; run ampkit-launch once on each.")
    ("node-rank", po::value<int>(&o.node_rank)->default_value(0), "This node's index in [0, nnodes); node 0 runs rank 0, which hosts the rendezvous store.")
    ("master-addr", po::value<std::string>(&o.addr)->default_value("127.0.0.1"), "Address of node 0, reachable from every node.")
    ("master-port", po::value<int>(&o.port)->default_value(29500), "Free TCP port on node 0 for the rendezvous store.")
    ("grace-seconds", po::value<double>(&o.grace)->default_value(30.0), "After a rank fails (or a second signal), seconds the others get to exit after SIGTERM before SIGKILL (long enough for them to say which rank was lost).");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(o.split, argv).options(options).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "ampkit-launch: error: %s (see ampkit-launch --help)\n", e.what());
    return kUsage;
  }
  if (vm.count("help")) {
    std::cout
        << options
        << "\nEach rank gets torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
           "GROUP_RANK,\n"
           "ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Output lines are prefixed with [rank R].\n"
           "SIGINT/SIGTERM are forwarded to every rank. When a rank fails, the others get SIGTERM, then\n"
           "SIGKILL after --grace-seconds; the exit code is the first failed rank's (128+signal if killed).\n"
        << ampkit::exit_codes_help(
               {ampkit::ExitCode::ok, ampkit::ExitCode::usage, ampkit::ExitCode::distributed})
        << " 7 here: a rank could not be started.\n";
    return 0;
  }
  auto usage = [](const std::string& message) {
    std::fprintf(stderr, "ampkit-launch: error: %s\n", message.c_str());
    return kUsage;
  };
  if (o.split >= argc - 1) return usage("no program given: ampkit-launch [options] -- PROGRAM [ARGS...]");
  if (o.nproc < 1 || o.nproc > 1024)
    return usage("--nproc-per-node must be in [1, 1024], got " + std::to_string(o.nproc));
  if (o.nnodes < 1) return usage("--nnodes must be >= 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return usage("--node-rank " + std::to_string(o.node_rank) + " is outside [0, " +
                 std::to_string(o.nnodes) + ")");
  if (o.port < 1 || o.port > 65535)
    return usage("--master-port must be in 1..65535, got " + std::to_string(o.port));
  if (!(o.grace >= 0)) return usage("--grace-seconds must be >= 0");
  return std::nullopt;
}

// In the forked child: torchrun's environment, then the program. Never returns.
[[noreturn]] void exec_rank(const LaunchOptions& o, char** argv, int rank, int local, int out_fd,
                            int err_fd) {
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::signal(s, SIG_DFL);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int world = o.nproc * o.nnodes;
  auto set = [](const char* k, int v) { ::setenv(k, std::to_string(v).c_str(), 1); };
  set("RANK", rank);
  set("WORLD_SIZE", world);
  set("LOCAL_RANK", local);
  set("LOCAL_WORLD_SIZE", o.nproc);
  set("GROUP_RANK", o.node_rank);
  set("ROLE_RANK", rank);
  set("ROLE_WORLD_SIZE", world);
  set("MASTER_PORT", o.port);
  ::setenv("MASTER_ADDR", o.addr.c_str(), 1);
  ::execvp(argv[o.split + 1], argv + o.split + 1);
  std::fprintf(stderr, "ampkit-launch: error: cannot run %s: %s\n", argv[o.split + 1], std::strerror(errno));
  ::_exit(kLaunchFailed);  // "a rank could not be started" (exit 7), not the shell's 127
}

// Starts this node's ranks with their output on pipes; false (after one line) when one cannot start.
bool start_ranks(const LaunchOptions& o, char** argv, std::vector<Rank>& ranks) {
  ranks.resize(static_cast<size_t>(o.nproc));
  for (int local = 0; local < o.nproc; ++local) {
    Rank& r = ranks[static_cast<size_t>(local)];
    r.rank = o.node_rank * o.nproc + local;
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return false;
    // Signals stay blocked across fork until the child has dropped our handlers: a SIGTERM
    // caught in between would otherwise be written into our own signal pipe.
    sigset_t all, previous;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &previous);
    r.pid = ::fork();
    if (r.pid != 0) ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (r.pid < 0) {
      std::fprintf(stderr, "ampkit-launch: error: cannot start rank %d: %s\n", r.rank, std::strerror(errno));
      return false;
    }
    if (r.pid == 0) exec_rank(o, argv, r.rank, local, out[1], err[1]);
    ::close(out[1]);
    ::close(err[1]);
    r.out = out[0];
    r.err = err[0];
  }
  return true;
}

// Watches the ranks: prefixes and forwards their output, forwards signals, stops the others when
// one fails (SIGTERM, then SIGKILL after the grace period) and keeps the first failure's code.
class Supervisor {
 public:
  Supervisor(std::vector<Rank>& ranks, double grace) : ranks_(ranks), grace_(grace) {}

  int run() {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<std::pair<size_t, bool>> owner;  // rank index, is stderr
      watch_list(fds, owner);
      bool any_running = false;
      for (const auto& r : ranks_) any_running |= r.running;
      if (!any_running && fds.size() == 1) break;
      ::poll(fds.data(), fds.size(), 200);
      if (fds[0].revents & POLLIN) forward_signals();
      pump_output(fds, owner);
      reap();
      kill_stragglers();
    }
    // A rank that died of a forwarded signal is reported by its status; 130 on Ctrl-C as usual.
    if (exit_code_ == 0)
      for (const auto& r : ranks_)
        if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) return exit_code_of_status(r.status);
    return exit_code_;
  }

 private:
  void signal_all(int s) {
    for (auto& r : ranks_)
      if (r.running) ::kill(r.pid, s);
  }

  void watch_list(std::vector<pollfd>& fds, std::vector<std::pair<size_t, bool>>& owner) const {
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owner.emplace_back(0, false);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].out >= 0) {
        fds.push_back({ranks_[i].out, POLLIN, 0});
        owner.emplace_back(i, false);
      }
      if (ranks_[i].err >= 0) {
        fds.push_back({ranks_[i].err, POLLIN, 0});
        owner.emplace_back(i, true);
      }
    }
  }

  void forward_signals() {
    char buf[64];
    const ssize_t n = ::read(g_signal_pipe[0], buf, sizeof buf);
    for (ssize_t k = 0; k < n; ++k) {
      const int s = buf[k];
      if (s == SIGCHLD) continue;
      // From here ranks exiting non-zero (130 after a checkpoint) are the signal's doing: they
      // are waited for, not stopped, so each can finish its own shutdown.
      ++signals_seen_;
      if (signals_seen_ == 1) {
        std::fprintf(stderr, "ampkit-launch: %s: forwarding to every rank\n", strsignal(s));
        signal_all(s);
      } else {
        std::fprintf(stderr, "ampkit-launch: second signal: killing every rank\n");
        signal_all(SIGKILL);
      }
    }
  }

  void pump_output(std::vector<pollfd>& fds, const std::vector<std::pair<size_t, bool>>& owner) {
    for (size_t f = 1; f < fds.size(); ++f) {
      if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = ranks_[owner[f].first];
      const bool is_err = owner[f].second;
      char buf[65536];
      const ssize_t n = ::read(fds[f].fd, buf, sizeof buf);
      if (n > 0) {
        emit(r.rank, is_err ? r.err_line : r.out_line, buf, static_cast<size_t>(n), is_err ? stderr : stdout,
             false);
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        emit(r.rank, is_err ? r.err_line : r.out_line, "", 0, is_err ? stderr : stdout, true);
        ::close(fds[f].fd);
        (is_err ? r.err : r.out) = -1;
      }
    }
  }

  void reap() {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && first_failed_ < 0 && !stopping_ && signals_seen_ == 0) {
        first_failed_ = r.rank;
        exit_code_ = exit_code_of_status(status);
        std::fprintf(stderr, "ampkit-launch: rank %d %s; stopping the other ranks\n", r.rank,
                     describe(status).c_str());
        stopping_ = true;
        signal_all(SIGTERM);
        kill_at_ = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(grace_));
      } else if (failed && exit_code_ == 0) {
        exit_code_ = exit_code_of_status(status);
      }
    }
  }

  void kill_stragglers() {
    if (!stopping_ || std::chrono::steady_clock::now() < kill_at_) return;
    bool left = false;
    for (const auto& r : ranks_) left |= r.running;
    if (left) {
      std::fprintf(stderr, "ampkit-launch: ranks still running %.1f s after SIGTERM: SIGKILL\n", grace_);
      signal_all(SIGKILL);
    }
    kill_at_ = std::chrono::steady_clock::time_point::max();
  }

  std::vector<Rank>& ranks_;
  double grace_;
  int exit_code_ = 0;
  int first_failed_ = -1;
  int signals_seen_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point kill_at_{};
};

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions o;
  if (const auto stop = parse_options(argc, argv, o)) return *stop;
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return kLaunchFailed;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::sigaction(s, &action, nullptr);
  std::vector<Rank> ranks;
  if (!start_ranks(o, argv, ranks)) return kLaunchFailed;
  return Supervisor(ranks, o.grace).run();
}
