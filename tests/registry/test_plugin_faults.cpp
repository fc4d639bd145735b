// The fault reporter in a host that defines no exit()/_exit() of its own (as Python's, and this
// test program): a loaded plugin's own exits reach it through its rebound references, and a crash
// in a plugin's own thread is known by where it happened; any other crash is left to the handler
// the host had. Each case runs in a forked child, which the fault ends.
#include <ampkit/kinds.h>
#include <ampkit/plugin_call.h>
#include <ampkit/plugin_options.h>
#include <ampkit/registry.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "registry_test_support.h"

using namespace ampkit;
using ampkit::test::kBrokenDir;
using ampkit::test::only;

namespace {

// How a child ended: its exit code (-1 if killed), the signal that killed it (0 if none), and
// everything it wrote to stderr.
struct Ended {
  int code = -1;
  int signal = 0;
  std::string stderr_text;
};

// Runs `body` in a forked child with crash signals at their default action (Boost.Test's
// handlers are not inherited), no plugin numbered by earlier tests in this program, and stderr
// captured; the child exits 0 if `body` returns.
Ended run_in_child(const std::function<void()>& body) {
  int fds[2];
  BOOST_TEST_REQUIRE(::pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::signal(sig, SIG_DFL);
    forget_plugin_ids();
    body();
    ::_exit(0);
  }
  ::close(fds[1]);
  Ended ended;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    ended.stderr_text.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) ended.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) ended.signal = WTERMSIG(status);
  return ended;
}

// The broken scaler `name` from `folder` (under the broken-plugins folder), loaded as a host
// loads it (no probe: the faults act only when created or started) and created with its defaults.
struct LoadedScaler {
  std::string file;
  std::unique_ptr<Strategy> strategy;

  LoadedScaler(const std::string& folder, const std::string& name, bool create_in_call = true) {
    RegistryOptions o = only({kBrokenDir / folder});
    o.probe = false;
    Registry registry(o);
    const LoadedPlugin& plugin = registry.load(registry.find("scaler", name));
    file = plugin.info().path.string();
    OptionInputs defaults;
    defaults.read_environment = false;
    const ResolvedOptions options = resolve_options(plugin.descriptor(), defaults);
    if (!create_in_call) return;
    PluginCall call(plugin_id("scaler '" + name + "' 0.1.0 (" + file + ")"), "its constructor");
    strategy = plugin.create(options.values);
  }
};

constexpr int kPluginExit = 3;
// An unmapped address (below mmap_min_addr) that is not null: the store is made (volatile) and the
// kernel faults it, where a store to nullptr is UBSan's report in the instrumented build.
int* volatile g_nowhere = reinterpret_cast<int*>(uintptr_t{64});

}  // namespace

BOOST_AUTO_TEST_SUITE(plugin_faults)

// Fault P4 (docs/python.md): _exit(0) in the constructor ended the host with exit 0 and no word.
BOOST_AUTO_TEST_CASE(a_plugins_exit_in_a_call_is_reported_naming_it_and_the_call) {
  const std::string file = (kBrokenDir / "faults/os_exit/libampkit-scaler-create_os_exit.so").string();
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    LoadedScaler scaler("faults/os_exit", "create_os_exit");
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(e.stderr_text == "test-host: error: scaler 'create_os_exit' 0.1.0 (" + file +
                                  ") called _exit() in its constructor; the run stops\n");
}

// The same plugin built with -fno-plt, -z now and full RELRO: _exit through a read-only GOT slot.
BOOST_AUTO_TEST_CASE(a_plugins_exit_through_a_read_only_got_slot_is_reported_too) {
  const std::string file =
      (kBrokenDir / "faults/os_exit_now/libampkit-scaler-create_os_exit_now.so").string();
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    LoadedScaler scaler("faults/os_exit_now", "create_os_exit_now");
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(e.stderr_text == "test-host: error: scaler 'create_os_exit_now' 0.1.0 (" + file +
                                  ") called _exit() in its constructor; the run stops\n");
}

// exit(0) in a plugin's own thread, no plugin call active and no run in progress: still the
// plugin's (only its code reaches the rebound exit), one line, exit 3.
BOOST_AUTO_TEST_CASE(exit_in_a_plugins_own_thread_is_reported_naming_the_plugins) {
  const std::string file = (kBrokenDir / "after/thread_exit/libampkit-scaler-thread_exit.so").string();
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    LoadedScaler scaler("after/thread_exit", "thread_exit");
    scaler.strategy->start(RunInfo{});  // the thread calls exit(0) 0.3 s later
    std::this_thread::sleep_for(std::chrono::seconds(20));
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(e.stderr_text ==
             "test-host: error: exit() was called outside any plugin call (in a plugin's own thread, or in "
             "ampkit itself); plugins loaded: scaler 'thread_exit' 0.1.0 (" +
                 file + "); the run stops\n");
}

// A crash in a plugin's own thread, outside any call: its faulting address is in the plugin's code.
BOOST_AUTO_TEST_CASE(a_crash_in_a_plugins_own_thread_is_reported_naming_the_plugins) {
  const std::string file = (kBrokenDir / "after/thread_segv/libampkit-scaler-thread_segv.so").string();
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    LoadedScaler scaler("after/thread_segv", "thread_segv");
    scaler.strategy->start(RunInfo{});  // the thread writes through a null pointer 0.3 s later
    std::this_thread::sleep_for(std::chrono::seconds(20));
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(e.stderr_text ==
             "test-host: error: crashed (SIGSEGV, invalid memory access) outside any plugin call (in a "
             "plugin's own thread, or in ampkit itself); plugins loaded: scaler 'thread_segv' 0.1.0 (" +
                 file + "); the run stops\n");
}

// The host's own crash, with a plugin loaded and no call active, goes to the handler the host had
// before (Python's faulthandler, say): no line of ours, the previous handler's exit code.
BOOST_AUTO_TEST_CASE(a_crash_outside_plugin_code_goes_to_the_previous_handler) {
  const Ended e = run_in_child([] {
    struct sigaction previous {};
    previous.sa_handler = [](int) { ::_exit(97); };
    sigemptyset(&previous.sa_mask);
    ::sigaction(SIGSEGV, &previous, nullptr);
    install_plugin_fault_reporter("test-host", kPluginExit);
    LoadedScaler scaler("after/thread_segv", "thread_segv", /*create_in_call=*/false);
    *g_nowhere = 1;
  });
  BOOST_TEST(e.code == 97);
  BOOST_TEST(e.stderr_text == "");
}

// A host that installs no reporter (an embedder) gets libc's _exit: the status the plugin gave.
BOOST_AUTO_TEST_CASE(without_the_reporter_a_plugins_exit_is_libcs) {
  const Ended e = run_in_child([] { LoadedScaler scaler("faults/os_exit", "create_os_exit"); });
  BOOST_TEST(e.code == 0);
  BOOST_TEST(e.stderr_text == "");
}

// Two plugins of one kind (two GradScalers with different scalers): each call is reported as its
// own plugin's. Until 2026-11-28 the reporter kept one name per kind, the last one made: a crash
// in update_segv's update() was reported as the later scaler 'dynamic''s.
BOOST_AUTO_TEST_CASE(two_plugins_of_one_kind_are_each_reported_by_their_own_name) {
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    const int first = plugin_id("scaler 'first' 0.1.0 (/x/first.so)");
    (void)plugin_id("scaler 'second' 0.1.0 (/x/second.so)");
    PluginCall call(first, "update()");
    *g_nowhere = 1;
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(
      e.stderr_text ==
      "test-host: error: scaler 'first' 0.1.0 (/x/first.so) crashed (SIGSEGV, invalid memory access) in "
      "update(); the run stops\n");
}

namespace {

// Waits until `flag` holds `value` (another thread's step), 10 s at most.
void wait_for(const std::atomic<int>& flag, int value) {
  for (int i = 0; i < 10000 && flag.load() != value; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Starts a thread that makes a call into "scaler 'first'" (update(), with a limit of `timeout` s)
// and stays in it until `stage` is 2; returns once the call has begun (`stage` 1).
std::thread first_threads_call(std::atomic<int>& stage, unsigned timeout = 0) {
  std::thread first([&stage, timeout] {
    PluginCall call(plugin_id("scaler 'first' 0.1.0 (/x/first.so)"), "update()", timeout);
    stage = 1;
    wait_for(stage, 2);
  });
  wait_for(stage, 1);
  return first;
}

}  // namespace

// Thread 1 enters a call, thread 2 enters one, thread 1 leaves: thread 2 is still in its call.
// Until 2026-11-28 thread 1's leaving restored "no call" for the whole process, so thread 2's
// crash went unreported (the default action: killed by SIGSEGV, no line).
BOOST_AUTO_TEST_CASE(a_call_on_one_thread_is_not_ended_by_another_threads_call_ending) {
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    std::atomic<int> stage{0};
    std::thread first = first_threads_call(stage);
    PluginCall call(plugin_id("clipper 'second' 0.1.0 (/x/second.so)"), "clip()");
    stage = 2;
    first.join();
    *g_nowhere = 1;
  });
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(
      e.stderr_text ==
      "test-host: error: clipper 'second' 0.1.0 (/x/second.so) crashed (SIGSEGV, invalid memory access) in "
      "clip(); the run stops\n");
}

// The same interleaving, both calls over: no call is active. Until 2026-11-28 the second call's
// end restored the first's record, so a later _exit(7) of the host's own was reported as the
// first plugin's ("called _exit() in update()", exit 3).
BOOST_AUTO_TEST_CASE(interleaved_calls_on_two_threads_leave_no_call_behind) {
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    std::atomic<int> stage{0};
    std::thread first = first_threads_call(stage);
    {
      PluginCall call(plugin_id("clipper 'second' 0.1.0 (/x/second.so)"), "clip()");
      stage = 2;
      first.join();
    }
    ::_exit(report_plugin_exit(7));
  });
  BOOST_TEST(e.code == 7);
  BOOST_TEST(e.stderr_text == "");
}

// A call with a 1 s limit that hangs while another thread's call holds a 60 s limit: reported at
// its own limit. Until 2026-11-28 only one limit was armed at a time, so the second call went
// unwatched (here: it returned after 20 s, exit 0).
BOOST_AUTO_TEST_CASE(a_time_limit_is_watched_while_another_threads_call_has_one) {
  const auto start = std::chrono::steady_clock::now();
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    std::atomic<int> stage{0};
    std::thread first = first_threads_call(stage, 60);
    {
      PluginCall call(plugin_id("nan_policy 'second' 0.1.0 (/x/second.so)"), "decide()", 1);
      std::this_thread::sleep_for(std::chrono::seconds(20));
    }
    stage = 2;
    first.join();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(e.code == kPluginExit);
  BOOST_TEST(e.stderr_text ==
             "test-host: error: nan_policy 'second' 0.1.0 (/x/second.so) did not return (time "
             "limit reached) in decide(); the run stops\n");
  BOOST_TEST(seconds < 10.0);
}

// A fork() child has only the forking thread: another thread's call in the parent is not running
// there, so the child's own _exit(7) is its own.
BOOST_AUTO_TEST_CASE(a_fork_child_keeps_only_the_forking_threads_calls) {
  const Ended e = run_in_child([] {
    install_plugin_fault_reporter("test-host", kPluginExit);
    std::atomic<int> stage{0};
    std::thread first = first_threads_call(stage);
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(report_plugin_exit(7));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    stage = 2;
    first.join();
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 99);
  });
  BOOST_TEST(e.code == 7);
  BOOST_TEST(e.stderr_text == "");
}

BOOST_AUTO_TEST_SUITE_END()
