// The plugin fault reporter (plugin_call.h): a record of the running plugin call and the
// handlers that report a crash, an exit() or a hang inside it.
#include "ampkit/plugin_call.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "plugin_image.h"
#include "registry_internal.h"

namespace ampkit {

namespace {

constexpr size_t kNameLength = 480;
constexpr int kMaxNames = 256;
// plugin_id()'s descriptions: entries below g_name_count are written once and kept (until
// forget_plugin_ids()), so a handler reads them without a lock.
char g_names[kMaxNames][kNameLength];
std::atomic<int> g_name_count{0};
std::mutex g_names_mutex;  // plugin_id()'s writers
char g_program[64] = "ampkit";
int g_exit_code = 3;
bool g_installed = false;
bool g_time_limits = true;
// The handlers in place before ours (SIG_DFL in a program; Python's faulthandler, say, in an
// interpreter): outside plugin code a fatal signal goes to them as if we were not here.
struct sigaction g_previous[NSIG];

// One active plugin call. The thread that claims a free record (state 0 -> 1) fills it in and
// publishes it (2); the handlers and the watchdog read only published records. Every field is an
// atomic, and `call` a string literal, so a reader racing a record's release reads valid values.
struct ActiveCall {
  std::atomic<int> state{0};  // 0 free, 1 being filled in, 2 active
  std::atomic<pthread_t> thread{};
  std::atomic<int> plugin{-1};  // plugin_id()
  std::atomic<const char*> call{nullptr};
  std::atomic<unsigned> depth{0};    // nesting on its thread: the deepest is the one running
  std::atomic<int64_t> deadline{0};  // steady clock, ns; 0: no time limit
};
constexpr int kMaxCalls = 64;
ActiveCall g_calls[kMaxCalls];
thread_local unsigned t_depth = 0;
volatile sig_atomic_t g_run_in_progress = 0;  // set_run_in_progress()
// The plugin call the latest exception on this thread unwound (unwound_plugin_call()).
thread_local int t_unwound_plugin = -1;
thread_local const char* t_unwound_call = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void put(const char* s) {
  (void)!::write(STDERR_FILENO, s, std::strlen(s));
}

const char* plugin_name(int plugin) {
  return plugin >= 0 && plugin < g_name_count.load(std::memory_order_acquire) ? g_names[plugin] : "a plugin";
}

// "<program>: error: <plugin> <what> in <call>; the run stops\n", from async-signal-safe calls.
void report(const ActiveCall& active, const char* what) {
  const char* call = active.call.load(std::memory_order_relaxed);
  put(g_program);
  put(": error: ");
  put(plugin_name(active.plugin.load(std::memory_order_relaxed)));
  put(" ");
  put(what);
  put(" in ");
  put(call != nullptr ? call : "a call");
  put("; the run stops\n");
}

const char* signal_text(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "crashed (SIGSEGV, invalid memory access)";
    case SIGBUS:
      return "crashed (SIGBUS)";
    case SIGILL:
      return "crashed (SIGILL, illegal instruction)";
    case SIGFPE:
      return "crashed (SIGFPE, arithmetic fault)";
    case SIGABRT:
      return "aborted (SIGABRT)";
    default:
      return "crashed";
  }
}

// "<program>: error: <what> outside any plugin call (a plugin's own thread, or ampkit itself);
// plugins loaded: <each>; the run stops\n": while a run is in progress, a plugin's thread that
// crashes or calls exit() is not in a plugin call, but is most likely the plugins' doing.
void report_outside(const char* what) {
  put(g_program);
  put(": error: ");
  put(what);
  put(" outside any plugin call (in a plugin's own thread, or in ampkit itself); plugins loaded: ");
  const int count = g_name_count.load(std::memory_order_acquire);
  for (int i = 0; i < count; ++i) {
    if (i > 0) put(", ");
    put(g_names[i]);
  }
  if (count == 0) put("none");
  put("; the run stops\n");
}

// The call running on this thread (the deepest of its active records), or null. Async-signal-safe.
const ActiveCall* this_threads_call() {
  const pthread_t self = pthread_self();
  const ActiveCall* found = nullptr;
  for (const ActiveCall& c : g_calls) {
    if (c.state.load(std::memory_order_acquire) != 2 ||
        !pthread_equal(c.thread.load(std::memory_order_relaxed), self))
      continue;
    if (found == nullptr ||
        c.depth.load(std::memory_order_relaxed) > found->depth.load(std::memory_order_relaxed))
      found = &c;
  }
  return found;
}

// Any thread's active call, or null. Async-signal-safe.
const ActiveCall* any_call() {
  for (const ActiveCall& c : g_calls)
    if (c.state.load(std::memory_order_acquire) == 2) return &c;
  return nullptr;
}

// In a fork() child only the forking thread goes on: the other threads' calls are not running there.
void keep_only_this_threads_calls() {
  const pthread_t self = pthread_self();
  for (ActiveCall& c : g_calls)
    if (c.state.load(std::memory_order_relaxed) != 0 &&
        !pthread_equal(c.thread.load(std::memory_order_relaxed), self))
      c.state.store(0, std::memory_order_relaxed);
}

// A free record, claimed (state 1), or -1 when all are taken: that call goes unrecorded.
int claim_record() {
  for (int i = 0; i < kMaxCalls; ++i) {
    int expected = 0;
    if (g_calls[i].state.load(std::memory_order_relaxed) == 0 &&
        g_calls[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire))
      return i;
  }
  return -1;
}

// Where the thread was when the kernel raised the signal (a fault, not a kill()): 0 if unknown.
uintptr_t faulting_pc(const siginfo_t* info, const void* context) {
  if (info == nullptr || context == nullptr || info->si_code <= 0) return 0;
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

// Outside a plugin call a fault is still the plugins' when a plugin's own code faulted (its own
// thread), or, while a host's run is in progress, whatever faulted.
extern "C" void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  const ActiveCall* in_call = this_threads_call();
  if (in_call == nullptr && (g_run_in_progress || detail::is_plugin_code(faulting_pc(info, context)))) {
    report_outside(signal_text(sig));
    end_process(g_exit_code);
  }
  if (in_call == nullptr) {  // not in plugin code: behave as if we were not here
    ::sigaction(sig, &g_previous[sig], nullptr);
    ::raise(sig);
    return;
  }
  report(*in_call, signal_text(sig));
  end_process(g_exit_code);
}

// What a plugin's own references to exit, quick_exit, _exit and _Exit reach (guard_loaded_plugin):
// only a plugin's code calls these, so outside a plugin call on this thread it is still the
// plugins' doing (their own thread), whether or not a host said its run is in progress. Without
// the reporter installed they are libc's.
[[noreturn]] void end_for_plugin(const char* in_call, const char* outside) {
  if (const ActiveCall* active = this_threads_call())
    report(*active, in_call);
  else
    report_outside(outside);
  end_process(g_exit_code);
}

[[noreturn]] void plugin_exit(int status) {
  if (g_installed) end_for_plugin("called exit()", "exit() was called");
  std::exit(status);
}

[[noreturn]] void plugin_quick_exit(int status) {
  if (g_installed) end_for_plugin("called quick_exit()", "quick_exit() was called");
  std::quick_exit(status);
}

[[noreturn]] void plugin_os_exit(int status) {  // _exit and _Exit
  if (g_installed) end_for_plugin("called _exit()", "_exit() was called");
  end_process(status);
}

extern "C" void on_exit_call() {
  report_exit_call();
}

// A thread, not SIGALRM: a plugin that blocks or handles SIGALRM cannot defeat it, and every time
// limited call is watched, on every thread, nested or not. It wakes ten times a second; a call
// that has not returned by its deadline is reported and the process ends.
void watch_deadlines() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t now = now_ns();
    for (const ActiveCall& c : g_calls) {
      if (c.state.load(std::memory_order_acquire) != 2) continue;
      const int64_t deadline = c.deadline.load(std::memory_order_relaxed);
      if (deadline != 0 && now > deadline) {
        report(c, "did not return (time limit reached)");
        end_process(g_exit_code);
      }
    }
  }
}

// The process whose watchdog runs: a fork() child has none (only the forking thread goes on in
// it), so a time-limited call in a child starts its own before it arms its deadline.
std::atomic<pid_t> g_watched_pid{0};

void ensure_watchdog() {
  const pid_t self = ::getpid();
  pid_t watched = g_watched_pid.load(std::memory_order_acquire);
  if (watched == self || !g_watched_pid.compare_exchange_strong(watched, self, std::memory_order_acq_rel))
    return;
  try {
    std::thread(watch_deadlines).detach();
  } catch (const std::system_error&) {  // no thread to be had: the call goes unwatched, as before
    g_watched_pid.store(0, std::memory_order_release);
  }
}

}  // namespace

void install_plugin_fault_reporter(const char* program, int exit_code, bool time_limits) {
  std::snprintf(g_program, sizeof g_program, "%s", program);
  g_exit_code = exit_code;
  if (g_installed) return;
  g_installed = true;
  g_time_limits = time_limits;
  // A stack overflow in a plugin still gets its line: the handler runs on a stack of its own.
  static char alternate_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alternate_stack;
  ss.ss_size = sizeof alternate_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, &g_previous[sig]);
  if (time_limits) ensure_watchdog();
  std::atexit(on_exit_call);
}

void report_exit_call() noexcept {
  if (!g_installed) return;
  const ActiveCall* in_call = this_threads_call();
  if (in_call == nullptr && g_run_in_progress) {
    report_outside("exit() was called");
    end_process(g_exit_code);
  }
  if (in_call == nullptr) return;
  report(*in_call, "called exit()");
  end_process(g_exit_code);
}

int report_plugin_exit(int status) noexcept {
  const ActiveCall* active = this_threads_call();
  if (active == nullptr) active = any_call();
  if (active == nullptr || !g_installed) return status;
  report(*active, "called _exit()");
  return g_exit_code;
}

void end_process(int status) noexcept {
  for (;;) ::syscall(SYS_exit_group, status);
}

void set_run_in_progress(bool in_progress) noexcept {
  g_run_in_progress = in_progress ? 1 : 0;
}

int plugin_id(const std::string& description) {
  const std::string kept = description.substr(0, kNameLength - 1);
  std::lock_guard<std::mutex> lock(g_names_mutex);
  const int count = g_name_count.load(std::memory_order_relaxed);
  for (int i = 0; i < count; ++i)
    if (kept == g_names[i]) return i;
  if (count < kMaxNames - 1) {
    std::snprintf(g_names[count], kNameLength, "%s", kept.c_str());
    g_name_count.store(count + 1, std::memory_order_release);
    return count;
  }
  if (count == kMaxNames - 1) {
    std::snprintf(g_names[count], kNameLength, "a plugin (more than %d were named)", kMaxNames - 1);
    g_name_count.store(kMaxNames, std::memory_order_release);
  }
  return kMaxNames - 1;
}

void forget_plugin_ids() noexcept {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  g_name_count.store(0, std::memory_order_release);
}

UnwoundPluginCall unwound_plugin_call() {
  if (t_unwound_plugin < 0) return {};
  return {plugin_name(t_unwound_plugin), t_unwound_call != nullptr ? t_unwound_call : "a call"};
}

void forget_unwound_plugin_call() noexcept {
  t_unwound_plugin = -1;
  t_unwound_call = nullptr;
}

namespace detail {

void guard_loaded_plugin(void* handle) {
  const Rebinding exits[] = {{"exit", reinterpret_cast<void*>(&plugin_exit)},
                             {"quick_exit", reinterpret_cast<void*>(&plugin_quick_exit)},
                             {"_exit", reinterpret_cast<void*>(&plugin_os_exit)},
                             {"_Exit", reinterpret_cast<void*>(&plugin_os_exit)}};
  rebind_references(handle, exits, sizeof exits / sizeof exits[0]);
  record_plugin_code(handle);
}

}  // namespace detail

PluginCall::PluginCall(int plugin, const char* call, unsigned timeout_seconds) noexcept
    : record_(-1), uncaught_(std::uncaught_exceptions()) {
  if (plugin < 0) return;
  static const bool forks_handled = ::pthread_atfork(nullptr, nullptr, keep_only_this_threads_calls) == 0;
  (void)forks_handled;
  record_ = claim_record();
  if (record_ < 0) return;
  ActiveCall& c = g_calls[record_];
  c.thread.store(pthread_self(), std::memory_order_relaxed);
  c.plugin.store(plugin, std::memory_order_relaxed);
  c.call.store(call, std::memory_order_relaxed);
  c.depth.store(++t_depth, std::memory_order_relaxed);
  int64_t deadline = 0;
  if (timeout_seconds > 0 && g_installed && g_time_limits) {
    ensure_watchdog();
    deadline = now_ns() + static_cast<int64_t>(timeout_seconds) * 1000000000LL;
  }
  c.deadline.store(deadline, std::memory_order_relaxed);
  c.state.store(2, std::memory_order_release);
}

PluginCall::~PluginCall() {
  if (record_ < 0) return;
  ActiveCall& c = g_calls[record_];
  if (std::uncaught_exceptions() > uncaught_) {
    t_unwound_plugin = c.plugin.load(std::memory_order_relaxed);
    t_unwound_call = c.call.load(std::memory_order_relaxed);
  }
  --t_depth;
  c.deadline.store(0, std::memory_order_relaxed);
  c.state.store(0, std::memory_order_release);
}

}  // namespace ampkit
