// Stop signals: a flag the loop polls, or an immediate exit where nothing is worth saving.
#include "session/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>

#include "ampkit/exit_codes.h"
#include "ampkit/plugin_call.h"

namespace ampkit::train {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_in_rendezvous = 0;

// A second signal ends the process at once with 130, even inside a plugin call that hangs:
// end_process, not _exit, which ampkit-train interposes to report a plugin's own _exit().
void on_stop_signal(int signal_number) {
  if (g_stop_signal != 0 || g_in_rendezvous != 0) end_process(exit_status(ExitCode::interrupted));
  g_stop_signal = signal_number;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(s, &action, nullptr);
}

int stop_signal() {
  return g_stop_signal;
}

void adopt_stop_signal(int signal_number) {
  if (g_stop_signal == 0) g_stop_signal = signal_number;
}

void set_in_rendezvous(bool waiting) {
  if (waiting && g_stop_signal != 0) end_process(exit_status(ExitCode::interrupted));
  g_in_rendezvous = waiting ? 1 : 0;
}

const char* signal_name(int s) {
  return s == SIGTERM ? "SIGTERM" : s == SIGINT ? "SIGINT" : s == SIGUSR1 ? "SIGUSR1" : "a signal";
}

}  // namespace ampkit::train
