// A TCP port for a multi-process test's rendezvous store (test_distributed, test_step_collectives).
#pragma once

namespace ampkit::test {

// A port no socket of this machine holds now, below 32768: Linux gives its ephemeral ports
// (32768-60999) to any outgoing connection, so one of those could be taken by another test's
// connection between this call and the store's bind (seen: "--master-port 35824 ... is in use by
// another program"). The search starts at a point spread by process id, so that test programs
// running side by side start apart, moves on with every call, and probes each port by binding it
// (without SO_REUSEADDR, so a port with connections still closing is passed over too). Throws
// std::runtime_error when no port in 20000-31999 is free.
int free_port();

}  // namespace ampkit::test
