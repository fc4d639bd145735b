// Starting and supervising one attempt of this node's ranks.
#include "ranks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ampkit/exit_codes.h"

namespace ampkit::launch {

namespace {

constexpr int kCouldNotStart = exit_status(ExitCode::distributed);

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal_number) {
  const int saved = errno;
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

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
  return kCouldNotStart;
}

// In the forked child: torchrun's environment, then the program. Never returns; when the program
// cannot be executed, errno goes to the parent through `report_fd` (closed by a successful exec).
[[noreturn]] void exec_rank(const LaunchOptions& o, char** argv, int rank, int local, int restart_count,
                            int out_fd, int err_fd, int report_fd) {
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
  set("TORCHELASTIC_RESTART_COUNT", restart_count);
  set("TORCHELASTIC_MAX_RESTARTS", o.max_restarts);
  ::setenv("MASTER_ADDR", o.addr.c_str(), 1);
  ::execvp(argv[o.split + 1], argv + o.split + 1);
  const int error = errno;
  [[maybe_unused]] ssize_t n = ::write(report_fd, &error, sizeof error);
  ::_exit(kCouldNotStart);  // "a rank could not be started" (exit 7), not the shell's 127
}

// Forks and executes one rank; false (after one line) when it could not be started or executed.
bool start_rank(const LaunchOptions& o, char** argv, int local, int restart_count, Rank& r) {
  int out[2], err[2], report[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(report, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "ampkit-launch: error: cannot start rank %d: %s\n", r.rank, std::strerror(errno));
    return false;
  }
  // Signals stay blocked across fork until the child has dropped our handlers: a SIGTERM caught
  // in between would otherwise be written into our own signal pipe.
  sigset_t all, previous;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, &previous);
  r.pid = ::fork();
  if (r.pid == 0) exec_rank(o, argv, r.rank, local, restart_count, out[1], err[1], report[1]);
  const int fork_error = errno;
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  for (int fd : {out[1], err[1], report[1]}) ::close(fd);
  r.out = out[0];
  r.err = err[0];
  if (r.pid < 0) {
    std::fprintf(stderr, "ampkit-launch: error: cannot start rank %d: %s\n", r.rank,
                 std::strerror(fork_error));
    r.running = false;
    ::close(report[0]);
    return false;
  }
  int error = 0;
  ssize_t n;
  do n = ::read(report[0], &error, sizeof error);
  while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n > 0) {
    std::fprintf(stderr, "ampkit-launch: error: cannot run %s: %s\n", argv[o.split + 1],
                 std::strerror(error));
    return false;
  }
  return true;
}

// Watches the ranks: prefixes and forwards their output, forwards signals, stops the others when
// one fails (SIGTERM, then SIGKILL after the grace period) and keeps the first failure.
class Supervisor {
 public:
  Supervisor(std::vector<Rank>& ranks, double grace, std::chrono::steady_clock::time_point start,
             bool restart_follows)
      : ranks_(ranks), grace_(grace), start_(start), restart_follows_(restart_follows) {}

  AttemptResult run() {
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
    result_.signalled = signals_seen_ > 0;
    // A rank that died of a forwarded signal is reported by its status; 130 on Ctrl-C as usual.
    if (result_.exit_code == 0)
      for (const auto& r : ranks_)
        if (!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0))
          result_.exit_code = exit_code_of_status(r.status);
    return result_;
  }

  void stop_all_now() {
    signal_all(SIGKILL);
    stopping_ = true;
    kill_at_ = std::chrono::steady_clock::time_point::max();
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
      if (failed && result_.failed_rank < 0 && !stopping_ && signals_seen_ == 0) {
        char when[32];
        std::snprintf(when, sizeof when, " at %.1f s",
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
        result_.failed_rank = r.rank;
        result_.failure = describe(status) + when;
        result_.exit_code = exit_code_of_status(status);
        std::fprintf(
            stderr, "ampkit-launch: rank %d %s; stopping the other ranks%s (SIGTERM, SIGKILL after %g s)\n",
            r.rank, result_.failure.c_str(),
            restart_follows_ && result_.exit_code != exit_status(ExitCode::usage) ? " to restart them" : "",
            grace_);
        stopping_ = true;
        signal_all(SIGTERM);
        // grace_ is at most kMaxGraceSeconds (checked in main.cpp): the nanoseconds cannot overflow.
        kill_at_ = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(grace_));
      } else if (failed && result_.exit_code == 0) {
        result_.exit_code = exit_code_of_status(status);
      }
    }
  }

  void kill_stragglers() {
    if (!stopping_ || std::chrono::steady_clock::now() < kill_at_) return;
    bool left = false;
    for (const auto& r : ranks_) left |= r.running;
    if (left) {
      std::fprintf(stderr,
                   "ampkit-launch: ranks still running %g s after SIGTERM: SIGKILL (--grace-seconds gives "
                   "them longer)\n",
                   grace_);
      signal_all(SIGKILL);
    }
    kill_at_ = std::chrono::steady_clock::time_point::max();
  }

  std::vector<Rank>& ranks_;
  double grace_;
  std::chrono::steady_clock::time_point start_;
  bool restart_follows_;
  AttemptResult result_;
  int signals_seen_ = 0;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point kill_at_{};
};

}  // namespace

bool install_signal_forwarding() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::sigaction(s, &action, nullptr);
  return true;
}

AttemptResult run_attempt(const LaunchOptions& o, char** argv, int restart_count,
                          std::chrono::steady_clock::time_point start) {
  std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
  bool started = true;
  size_t n = 0;
  for (; n < ranks.size() && started; ++n) {
    ranks[n].rank = o.node_rank * o.nproc + static_cast<int>(n);
    started = start_rank(o, argv, static_cast<int>(n), restart_count, ranks[n]);
  }
  ranks.resize(n);
  Supervisor supervisor(ranks, o.grace, start, restart_count < o.max_restarts);
  if (started) return supervisor.run();
  // A rank's program could not be executed: the ranks already started would wait for it at the
  // rendezvous until their timeout; they are killed, and nothing is restarted.
  supervisor.stop_all_now();
  AttemptResult r = supervisor.run();
  r.exit_code = kCouldNotStart;
  r.could_not_start = true;
  return r;
}

}  // namespace ampkit::launch
