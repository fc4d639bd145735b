// Probing plugins in a child process: a plugin that crashes, hangs or throws while it loads (or
// while its strategy is created) is reported with a clear line, and the host lives on.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "ampkit/plugin_options.h"
#include "ampkit/registry.h"
#include "registry_internal.h"

namespace ampkit {

ProbeResult probe_plugin(const PluginInfo& info, bool create, double timeout_seconds) {
  return probe_plugins({&info}, create, timeout_seconds);
}

// The probe child: writes 'R' once it runs, then loads (and creates) each plugin in turn, writing
// one '+' per plugin that passed, or '!' and the error message, then exits. A crash kills it,
// which the parent sees.
void run_probe(const std::vector<const PluginInfo*>& infos, bool create, int out_fd) {
  // The child inherits the host's signal handlers and mask (a crash reporter, Boost.Test's
  // execution monitor). A crash while loading must kill the child, so the parent sees it.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS}) ::signal(sig, SIG_DFL);
  // What the plugin's code prints here ("terminate called after throwing ...", a what(): line)
  // would come before the host's one-line verdict: the verdict says what happened.
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
  }
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_UNBLOCK, &all, nullptr);
  (void)!::write(out_fd, "R", 1);  // started: from here on the time taken is the plugins'
  for (const PluginInfo* info : infos) {
    std::string message;
    try {
      const ampkit_plugin_descriptor* d = detail::load_descriptor(*info, /*report_faults=*/false);
      if (create) {
        (void)!::write(out_fd, "L", 1);  // loaded; what follows is the plugin's own code
        OptionInputs defaults;
        defaults.read_environment = false;
        defaults.precision = RunInfo{}.precision;  // the run the probe starts below
        const ResolvedOptions options = resolve_options(*d, defaults);
        LoadedPlugin plugin(*info, d);
        auto strategy = plugin.create(options.values);
        strategy->start(RunInfo{});
        (void)strategy->save();
      }
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "plugin file " + info->path.string() + ": threw something that is not a std::exception " +
                (create ? "while loading or creating it" : "while being loaded");
    }
    if (!message.empty()) {
      message.insert(0, "!");
      (void)!::write(out_fd, message.data(), message.size());
      ::_exit(3);
    }
    (void)!::write(out_fd, "+", 1);
  }
  ::_exit(0);
}

namespace {

// The exec'd probe's arguments (probe_plugins' `program`), made before the fork: after it, only
// async-signal-safe calls.
std::vector<std::string> probe_arguments(const std::string& program,
                                         const std::vector<const PluginInfo*>& infos, bool create,
                                         int out_fd) {
  std::vector<std::string> args = {program, std::to_string(out_fd), create ? "1" : "0"};
  for (const PluginInfo* info : infos) {
    args.push_back(info->path.string());
    args.push_back((info->load_from.empty() ? info->path : info->load_from).string());
  }
  return args;
}

// In the forked child: the pinned files (/proc/self/fd/N) and the pipe stay open across exec.
[[noreturn]] void exec_probe(const std::vector<const PluginInfo*>& infos, char* const argv[], int out_fd) {
  for (const PluginInfo* info : infos)
    if (info->pinned_fd >= 0) ::fcntl(info->pinned_fd, F_SETFD, 0);
  ::fcntl(out_fd, F_SETFD, 0);
  ::execv(argv[0], argv);
  static const char failed[] = "!cannot run the plugin probe program ";
  (void)!::write(out_fd, failed, sizeof failed - 1);
  (void)!::write(out_fd, argv[0], std::strlen(argv[0]));
  ::_exit(3);
}

// The exec'd probe program's own start (loading LibTorch: about 0.4 s on an idle machine, several
// seconds on a starved one) runs no plugin code, so it is not charged to the first plugin file:
// it has this long, or the plugins' limit where that is longer.
constexpr double kProbeStartSeconds = 60.0;

// Whether `chunk` (the child's output after `before`) holds a marker of progress: the child has
// started ('R') or another file passed ('+'), before any error message ('!').
bool made_progress(const std::string& before, const char* chunk, size_t size) {
  if (before.find('!') != std::string::npos) return false;
  for (size_t i = 0; i < size && chunk[i] != '!'; ++i)
    if (chunk[i] == 'R' || chunk[i] == '+') return true;
  return false;
}

// Everything the child writes until it closes the pipe or a deadline passes (then timed_out). Each
// plugin file has `timeout_seconds` of its own, from the child's start or the previous file's
// '+': a file is blamed only for the time it took itself, not for a busy machine's slow start or
// the files loaded before it.
std::string read_until_closed(int fd, double timeout_seconds, bool& timed_out) {
  std::string message;
  const auto limit = [](double seconds) {
    return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double>(seconds));
  };
  auto deadline = limit(std::max(timeout_seconds, kProbeStartSeconds));
  timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    if (left <= 0 && timeout_seconds > 0) {
      timed_out = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int wait_ms = timeout_seconds > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : -1;
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;  // the pipe is unusable; waitpid still reports how the child ended
    if (r == 0) continue;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    if (made_progress(message, buf, static_cast<size_t>(n))) deadline = limit(timeout_seconds);
    message.append(buf, static_cast<size_t>(n));
  }
  return message;
}

// The verdict from the child's output and how it ended.
ProbeResult probe_verdict(const std::vector<const PluginInfo*>& infos, const std::string& message, int status,
                          bool timed_out, double timeout_seconds) {
  // The child writes 'R' once it runs, '+' per plugin that passed, 'L' once a plugin is loaded and
  // its strategy is being created, and '!' + the message on an error.
  const size_t bang = std::min(message.find('!'), message.size());
  const std::string markers = message.substr(0, bang);
  const bool started = markers.find('R') != std::string::npos;
  const size_t passed = static_cast<size_t>(std::count(markers.begin(), markers.end(), '+'));
  const bool creating = !markers.empty() && markers.back() == 'L';
  const std::string error = bang < message.size() ? message.substr(bang + 1) : "";
  const std::string path = infos[std::min(passed, infos.size() - 1)]->path.string();
  ProbeResult result;
  if (timed_out && !started) {
    result.message = "cannot check plugin file " + path + ": the plugin probe did not start within " +
                     std::to_string(static_cast<int>(std::max(timeout_seconds, kProbeStartSeconds))) +
                     " s (killed)";
  } else if (timed_out) {
    result.message = "plugin file " + path +
                     (creating ? " hung while creating its strategy" : " hung while loading") +
                     " (killed after " + std::to_string(static_cast<int>(timeout_seconds)) + " s)";
  } else if (WIFSIGNALED(status)) {
    result.crashed = true;
    result.message =
        "plugin file " + path +
        (creating ? " crashed while creating its strategy (signal " : " crashed while loading (signal ") +
        std::to_string(WTERMSIG(status)) + ", " + strsignal(WTERMSIG(status)) +
        (creating ? "), in its factory or constructor" : "), probably in a static initializer");
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && passed == infos.size()) {
    result.ok = true;
  } else {
    const std::string code = std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    result.message = !error.empty() ? error
                     : creating     ? "plugin file " + path + " ended the process (exit " + code +
                                      ") while creating its strategy: it calls exit()"
                                : "plugin file " + path + " failed to load (exit " + code + ")";
  }
  return result;
}

}  // namespace

// The parent knows which plugin failed, crashed or hung by the number of '+' the child wrote
// before the end.
ProbeResult probe_plugins(const std::vector<const PluginInfo*>& infos, bool create, double timeout_seconds,
                          const std::string& program) {
  if (infos.empty()) return {true, false, ""};
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return {false, false, "cannot create a pipe to probe " + infos.front()->path.string()};
  const std::vector<std::string> args = probe_arguments(program, infos, create, fds[1]);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return {false, false, "cannot fork to probe " + infos.front()->path.string()};
  if (pid == 0) {
    if (!program.empty()) exec_probe(infos, argv.data(), fds[1]);
    ::close(fds[0]);
    run_probe(infos, create, fds[1]);
  }
  ::close(fds[1]);
  bool timed_out = false;
  const std::string message = read_until_closed(fds[0], timeout_seconds, timed_out);
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return probe_verdict(infos, message, status, timed_out, timeout_seconds);
}

}  // namespace ampkit
