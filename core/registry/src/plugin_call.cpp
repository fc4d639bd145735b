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
#include <system_error>
#include <thread>

#include "ampkit/kinds.h"
#include "plugin_image.h"
#include "registry_internal.h"

namespace ampkit {

namespace {

constexpr size_t kNameLength = 480;
char g_names[kKindCount][kNameLength];  // per kind, what reports call the plugin
char g_program[64] = "ampkit";
int g_exit_code = 3;
bool g_installed = false;
bool g_time_limits = true;
// The handlers in place before ours (SIG_DFL in a program; Python's faulthandler, say, in an
// interpreter): outside plugin code a fatal signal goes to them as if we were not here.
struct sigaction g_previous[NSIG];
// The deadline of the active time-limited call (steady clock, ns; 0: none), watched by a thread.
std::atomic<int64_t> g_deadline{0};
volatile sig_atomic_t g_kind = -1;  // index into kKinds of the plugin being called, -1: none
const char* volatile g_call = nullptr;
pthread_t g_call_thread{};  // the thread that made the call: a fault on another is not the call's
volatile sig_atomic_t g_run_in_progress = 0;  // set_run_in_progress()
// The plugin call the latest exception on this thread unwound (unwound_plugin_call()).
thread_local int t_unwound_kind = -1;
thread_local const char* t_unwound_call = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int kind_index(const char* kind) {
  for (size_t i = 0; i < kKindCount; ++i)
    if (std::strcmp(kKinds[i].name, kind) == 0) return static_cast<int>(i);
  return -1;
}

void put(const char* s) {
  (void)!::write(STDERR_FILENO, s, std::strlen(s));
}

// "<program>: error: <plugin> <what> in <call>; the run stops\n", from async-signal-safe calls.
void report(const char* what) {
  const int kind = g_kind;
  put(g_program);
  put(": error: ");
  put(g_names[kind][0] != '\0' ? g_names[kind] : kKinds[kind].name);
  put(" ");
  put(what);
  put(" in ");
  put(g_call != nullptr ? g_call : "a call");
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
  bool first = true;
  for (size_t i = 0; i < kKindCount; ++i) {
    if (g_names[i][0] == '\0') continue;
    if (!first) put(", ");
    put(g_names[i]);
    first = false;
  }
  put("; the run stops\n");
}

bool in_call_on_this_thread() {
  return g_kind >= 0 && pthread_equal(pthread_self(), g_call_thread);
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
  const bool in_call = in_call_on_this_thread();
  if (!in_call && (g_run_in_progress || detail::is_plugin_code(faulting_pc(info, context)))) {
    report_outside(signal_text(sig));
    end_process(g_exit_code);
  }
  if (!in_call) {  // not in plugin code: behave as if we were not here
    ::sigaction(sig, &g_previous[sig], nullptr);
    ::raise(sig);
    return;
  }
  report(signal_text(sig));
  end_process(g_exit_code);
}

// What a plugin's own references to exit, quick_exit, _exit and _Exit reach (guard_loaded_plugin):
// only a plugin's code calls these, so outside a plugin call on this thread it is still the
// plugins' doing (their own thread), whether or not a host said its run is in progress. Without
// the reporter installed they are libc's.
[[noreturn]] void end_for_plugin(const char* in_call, const char* outside) {
  if (in_call_on_this_thread())
    report(in_call);
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
// limited call is watched, not only the first. It wakes ten times a second; a call that has not
// returned by its deadline is reported and the process ends.
void watch_deadlines() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t deadline = g_deadline.load(std::memory_order_acquire);
    if (deadline != 0 && now_ns() > deadline && g_kind >= 0) {
      report("did not return (time limit reached)");
      end_process(g_exit_code);
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
  const bool in_call = in_call_on_this_thread();
  if (!in_call && g_run_in_progress) {
    report_outside("exit() was called");
    end_process(g_exit_code);
  }
  if (!in_call) return;
  report("called exit()");
  end_process(g_exit_code);
}

int report_plugin_exit(int status) noexcept {
  if (g_kind < 0 || !g_installed) return status;
  report("called _exit()");
  return g_exit_code;
}

void end_process(int status) noexcept {
  for (;;) ::syscall(SYS_exit_group, status);
}

void set_run_in_progress(bool in_progress) noexcept {
  g_run_in_progress = in_progress ? 1 : 0;
}

void name_plugin(const std::string& kind, const std::string& description) {
  const int i = kind_index(kind.c_str());
  if (i >= 0) std::snprintf(g_names[i], kNameLength, "%s", description.c_str());
}

UnwoundPluginCall unwound_plugin_call() {
  if (t_unwound_kind < 0) return {};
  const int kind = t_unwound_kind;
  return {g_names[kind][0] != '\0' ? g_names[kind] : kKinds[kind].name,
          t_unwound_call != nullptr ? t_unwound_call : "a call"};
}

void forget_unwound_plugin_call() noexcept {
  t_unwound_kind = -1;
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

PluginCall::PluginCall(const char* kind, const char* call, unsigned timeout_seconds) noexcept
    : previous_kind_(g_kind), previous_call_(g_call), uncaught_(std::uncaught_exceptions()) {
  g_kind = kind_index(kind);
  g_call = call;
  g_call_thread = pthread_self();
  if (timeout_seconds > 0 && g_installed && g_time_limits &&
      g_deadline.load(std::memory_order_relaxed) == 0) {
    ensure_watchdog();
    g_deadline.store(now_ns() + static_cast<int64_t>(timeout_seconds) * 1000000000LL,
                     std::memory_order_release);
    armed_ = true;
  }
}

PluginCall::~PluginCall() {
  if (armed_) g_deadline.store(0, std::memory_order_release);
  if (g_kind >= 0 && std::uncaught_exceptions() > uncaught_) {
    t_unwound_kind = g_kind;
    t_unwound_call = g_call;
  }
  g_kind = previous_kind_;
  g_call = previous_call_;
}

}  // namespace ampkit
