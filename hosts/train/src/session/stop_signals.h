// SIGTERM/SIGINT/SIGUSR1 during a run: the first asks the loop to stop after the current step
// (then a checkpoint and the summary are written, exit 130); a second one exits at once, and so
// does the first while the rank waits in the rendezvous (nothing is trained yet, nothing to save).
#pragma once

namespace ampkit::train {

void install_stop_handlers();
// The signal that asked the run to stop, or 0.
int stop_signal();
// Another rank was signalled: this rank stops as if it had been.
void adopt_stop_signal(int signal_number);
// While set, a stop signal exits at once (exit 130).
void set_in_rendezvous(bool waiting);
const char* signal_name(int signal_number);

}  // namespace ampkit::train
