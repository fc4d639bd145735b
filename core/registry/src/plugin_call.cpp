// The plugin fault reporter (plugin_call.h): a record of the running plugin call and the
// handlers that report a crash, an exit() or a hang inside it.
#include "ampkit/plugin_call.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ampkit/kinds.h"

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
unsigned g_timeout = 0;
volatile sig_atomic_t g_kind = -1;  // index into kKinds of the plugin being called, -1: none
const char* volatile g_call = nullptr;

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

extern "C" void on_fatal_signal(int sig) {
  if (g_kind < 0) {  // not in plugin code: behave as if we were not here
    ::sigaction(sig, &g_previous[sig], nullptr);
    ::raise(sig);
    return;
  }
  report(signal_text(sig));
  end_process(g_exit_code);
}

extern "C" void on_alarm(int) {
  if (g_kind < 0) return;
  report("did not return (time limit reached)");
  end_process(g_exit_code);
}

extern "C" void on_exit_call() {
  if (g_kind < 0) return;
  report("called exit()");
  end_process(g_exit_code);
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
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_ONSTACK | SA_NODEFER;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, &g_previous[sig]);
  if (time_limits) {
    struct sigaction alarm {};
    alarm.sa_handler = on_alarm;
    ::sigemptyset(&alarm.sa_mask);
    ::sigaction(SIGALRM, &alarm, nullptr);
  }
  std::atexit(on_exit_call);
}

int report_plugin_exit(int status) noexcept {
  if (g_kind < 0 || !g_installed) return status;
  report("called _exit()");
  return g_exit_code;
}

void end_process(int status) noexcept {
  for (;;) ::syscall(SYS_exit_group, status);
}

void name_plugin(const std::string& kind, const std::string& description) {
  const int i = kind_index(kind.c_str());
  if (i >= 0) std::snprintf(g_names[i], kNameLength, "%s", description.c_str());
}

PluginCall::PluginCall(const char* kind, const char* call, unsigned timeout_seconds) noexcept
    : previous_kind_(g_kind), previous_call_(g_call) {
  g_kind = kind_index(kind);
  g_call = call;
  if (timeout_seconds > 0 && g_installed && g_time_limits && g_timeout == 0) {
    g_timeout = timeout_seconds;
    ::alarm(timeout_seconds);
    armed_ = true;
  }
}

PluginCall::~PluginCall() {
  if (armed_) {
    ::alarm(0);
    g_timeout = 0;
  }
  g_kind = previous_kind_;
  g_call = previous_call_;
}

}  // namespace ampkit
