// Which plugin call is running, so that a crash, an exit() or a hang inside plugin code is
// reported as that plugin's, by name, instead of ending the host without a word.
//
// A host calls install_plugin_fault_reporter() once at start-up. StrategySet gives each selected
// plugin its number (plugin_id) and creates it inside a PluginCall with a time limit; the engine
// wraps every call into a strategy in a PluginCall. Each call is recorded apart, with the thread
// that made it and the plugin it is into, so calls on several threads at once (two GradScalers in
// two threads), and plugins of one kind in several strategy sets (two GradScalers with different
// scalers), are each reported as their own. While one is active on a thread:
//   * a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) writes one line naming the plugin,
//     its file and the call, and ends the process with the host's exit code for plugin errors;
//   * exit(), quick_exit(), _exit() or _Exit() called by the plugin is reported the same way;
//   * a call with a time limit that has not returned when it expires likewise, whichever thread
//     made it (a watchdog thread checks ten times a second; a plugin that blocks SIGALRM cannot
//     defeat it).
// The registry binds each loaded plugin's own references to exit, quick_exit, _exit and _Exit to
// the reporter's handlers (whatever the host: Python's interpreter defines none of its own), and
// remembers where the plugin's code lies. So outside plugin calls, too, a plugin's own thread that
// exits, or crashes in the plugin's code, is reported in one line naming the loaded plugins, with
// the same exit code. Any other crash outside plugin calls goes to the handler the host had before
// (a crash is a crash; Python's faulthandler), except while a host says its run is in progress
// (set_run_in_progress): then that too is reported naming the loaded plugins. The active call
// costs a few stores; the handlers use only async-signal-safe functions. An exit() in a plugin's
// static initializers (before the binding) reaches the reporter's atexit hook; a host may also
// define exit/_exit/_Exit itself, for its plugins' dependencies, asking report_exit_call() and
// report_plugin_exit() first (ampkit-train: hosts/train/src/main.cpp).
#pragma once

#include <string>

namespace ampkit {

// Installs the handlers (an alternate signal stack included); `program` starts the line
// ("ampkit-train: error: ..."), `exit_code` ends the process. Idempotent. Outside plugin calls a
// fatal signal goes to the handler that was there before. Without `time_limits` no watchdog
// thread starts and PluginCall sets no deadline (an interpreter the user may pause in a debugger).
void install_plugin_fault_reporter(const char* program, int exit_code, bool time_limits = true);
// Between the strategies' creation and the run's end: a fatal signal or exit() outside plugin
// calls is then reported (see above). Async-signal-safe.
void set_run_in_progress(bool in_progress) noexcept;
// exit() was called: when a plugin call is active on this thread, or (run in progress) outside
// any, writes the line and ends the process; otherwise returns, and the caller exits as asked. An
// atexit hook calls it; a host that wants it to come first (before other atexit hooks and static
// destructors run while the run's threads still work) defines its own exit() that calls it.
void report_exit_call() noexcept;
// When a plugin call is active (this thread's, else any thread's): writes "... called _exit() in
// <call>; the run stops" and returns the host's exit code for plugin errors. Otherwise returns
// `status`. Async-signal-safe.
int report_plugin_exit(int status) noexcept;
// Ends the process at once with `status` (the exit_group system call, as libc's _exit does),
// bypassing any _exit interposer.
[[noreturn]] void end_process(int status) noexcept;
// The number a PluginCall into the plugin `description` ("scaler 'dynamic' 0.1.0
// (/x/libampkit-scaler-dynamic.so)") names it by; the same description gives the same number. The
// description is kept for the life of the process, and is among the "plugins loaded" a fault
// outside any call names. Past 256 descriptions, later ones share one number, reported as "a
// plugin (more than 255 were named)".
int plugin_id(const std::string& description);
// Forgets every description (tests that fork a child to see what it reports).
void forget_plugin_ids() noexcept;

// A catch (...) cannot see what it caught: PluginCall's destructor records the call an exception
// unwinds on this thread, so that the catch can tell a plugin's throw (reported as that plugin's,
// "<plugin> threw ... in <call>") from ampkit's own. The record stays until the next unwound call
// or forget_unwound_plugin_call(), which a catch-all's try block calls first.
struct UnwoundPluginCall {
  std::string plugin;  // its description (plugin_id); empty: no plugin call was unwound
  std::string call;
};
UnwoundPluginCall unwound_plugin_call();
void forget_unwound_plugin_call() noexcept;

class PluginCall {
 public:
  // `plugin` is a plugin_id() (< 0: nothing is recorded); `call` a string literal ("update()",
  // "its constructor"). `timeout_seconds` > 0 arms a time limit for this call.
  PluginCall(int plugin, const char* call, unsigned timeout_seconds = 0) noexcept;
  ~PluginCall();
  PluginCall(const PluginCall&) = delete;
  PluginCall& operator=(const PluginCall&) = delete;

 private:
  int record_;    // the record this call holds; -1: none
  int uncaught_;  // std::uncaught_exceptions() when the call began
};

}  // namespace ampkit
