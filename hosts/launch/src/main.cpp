// ampkit-launch: runs N ranks of a program on this node with torchrun's environment, prefixes
// their output with the rank, forwards signals, stops every rank when one fails, and restarts
// them (--max-restarts) as torchrun does. The ranks themselves: ranks.cpp.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "ampkit/exit_codes.h"
#include "ranks.h"

namespace po = boost::program_options;
using ampkit::launch::LaunchOptions;

namespace {

// Exit codes (docs/configuration.md): a failed rank's own code is passed on.
constexpr int kUsage = ampkit::exit_status(ampkit::ExitCode::usage);
constexpr int kLaunchFailed = ampkit::exit_status(ampkit::ExitCode::distributed);

// A seconds value as the user would write it back: "inf", "nan", "1e+19", "-1".
std::string seconds_text(double s) {
  if (std::isnan(s)) return "nan";  // printf may say "-nan"
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

// Parses and checks the options; returns an exit code when the launcher should stop (help, usage).
std::optional<int> parse_options(int argc, char** argv, LaunchOptions& o) {
  // Everything after "--" is the program and its arguments.
  o.split = 1;
  while (o.split < argc && std::strcmp(argv[o.split], "--") != 0) ++o.split;
  po::options_description options("usage: ampkit-launch [options] -- PROGRAM [ARGS...]\n\noptions");
  const std::string grace_help =
      "After a rank fails (or a second signal), seconds the others get to exit after SIGTERM before SIGKILL "
      "(long enough for them to say which rank was lost); at most " +
      seconds_text(ampkit::launch::kMaxGraceSeconds) + " (one day).";
  // clang-format off
  options.add_options()
    ("help,h", "Show this help.")
    ("nproc-per-node", po::value<int>(&o.nproc)->default_value(1), "Ranks to start on this node.")
    ("nnodes", po::value<int>(&o.nnodes)->default_value(1), "Nodes in the job; run ampkit-launch once on each.")
    ("node-rank", po::value<int>(&o.node_rank)->default_value(0), "This node's index in [0, nnodes); node 0 runs rank 0, which hosts the rendezvous store.")
    ("master-addr", po::value<std::string>(&o.addr)->default_value("127.0.0.1"), "Address of node 0, reachable from every node.")
    ("master-port", po::value<int>(&o.port)->default_value(29500), "Free TCP port on node 0 for the rendezvous store; 0 picks a free one (one node only).")
    ("max-restarts", po::value<int>(&o.max_restarts)->default_value(0), "When a rank fails, stop every rank and start them all again, up to this many times (torchrun's option); the program resumes from its newest checkpoint (ampkit-train: --checkpoint-dir).")
    ("grace-seconds", po::value<double>(&o.grace)->default_value(30.0), grace_help.c_str());
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(o.split, argv).options(options).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "ampkit-launch: error: %s (see ampkit-launch --help)\n", e.what());
    return kUsage;
  }
  if (vm.count("help")) {
    std::cout
        << options
        << "\nEach rank gets torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
           "GROUP_RANK,\n"
           "ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Output lines are prefixed with [rank R].\n"
           "SIGINT/SIGTERM are forwarded to every rank. When a rank fails, the others get SIGTERM, then\n"
           "SIGKILL after --grace-seconds; the exit code is the first failed rank's (128+signal if killed).\n"
           "With --max-restarts N every rank is started again after a failure, at most N times, with\n"
           "TORCHELASTIC_RESTART_COUNT set (ampkit-train then resumes from --checkpoint-dir).\n"
        << ampkit::exit_codes_help(
               {ampkit::ExitCode::ok, ampkit::ExitCode::usage, ampkit::ExitCode::distributed})
        << " 7 here: a rank could not be started.\n";
    return 0;
  }
  auto usage = [](const std::string& message) {
    std::fprintf(stderr, "ampkit-launch: error: %s\n", message.c_str());
    return kUsage;
  };
  if (o.split >= argc - 1) return usage("no program given: ampkit-launch [options] -- PROGRAM [ARGS...]");
  if (o.nproc < 1 || o.nproc > 1024)
    return usage("--nproc-per-node must be in [1, 1024], got " + std::to_string(o.nproc));
  if (o.nnodes < 1) return usage("--nnodes must be >= 1, got " + std::to_string(o.nnodes));
  // Checked as a division: the product itself could overflow an int.
  if (o.nnodes > ampkit::launch::kMaxWorldSize / o.nproc)
    return usage("--nnodes " + std::to_string(o.nnodes) + " x --nproc-per-node " + std::to_string(o.nproc) +
                 " is more than " + std::to_string(ampkit::launch::kMaxWorldSize) + " ranks");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return usage("--node-rank " + std::to_string(o.node_rank) + " is outside [0, " +
                 std::to_string(o.nnodes) + ")");
  if (o.port < 0 || o.port > 65535)
    return usage("--master-port must be in 0..65535, got " + std::to_string(o.port));
  if (o.port == 0 && o.nnodes > 1)
    return usage("--master-port 0 picks a port on this node only; with --nnodes " + std::to_string(o.nnodes) +
                 " give every node's launcher the same free port");
  if (o.max_restarts < 0 || o.max_restarts > 1000)
    return usage("--max-restarts must be in [0, 1000], got " + std::to_string(o.max_restarts));
  // Written so that nan fails too; inf and 1e19 would overflow the SIGKILL deadline (ranks.cpp).
  if (!(o.grace >= 0 && o.grace <= ampkit::launch::kMaxGraceSeconds))
    return usage("--grace-seconds must be in [0, " + seconds_text(ampkit::launch::kMaxGraceSeconds) +
                 "], got " + seconds_text(o.grace));
  return std::nullopt;
}

// --master-port 0: a port the kernel says is free now (bound, read back, released; rank 0 binds it
// again with SO_REUSEADDR a moment later, as torchrun's --standalone does).
int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof address;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::string restarts_text(int n) {
  return std::to_string(n) + (n == 1 ? " restart" : " restarts");
}

// A failed attempt is started again unless restarts are used up, the launcher was signalled, or
// the failure repeats by nature (a program that cannot run, a usage error).
bool restartable(const ampkit::launch::AttemptResult& r, int used, int max_restarts) {
  return r.exit_code != 0 && used < max_restarts && !r.signalled && !r.could_not_start &&
         r.failed_rank >= 0 && r.exit_code != kUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  LaunchOptions o;
  if (const auto stop = parse_options(argc, argv, o)) return *stop;
  if (o.port == 0) {
    o.port = pick_free_port();
    if (o.port <= 0) {
      std::fprintf(stderr, "ampkit-launch: error: --master-port 0: no free port: %s\n", std::strerror(errno));
      return kLaunchFailed;
    }
    std::fprintf(stderr, "ampkit-launch: rendezvous port %d (--master-port 0)\n", o.port);
  }
  if (!ampkit::launch::install_signal_forwarding()) return kLaunchFailed;
  for (int restarts = 0;; ++restarts) {
    const ampkit::launch::AttemptResult r = ampkit::launch::run_attempt(o, argv, restarts, start);
    if (r.exit_code == 0) {
      if (restarts > 0)
        std::fprintf(stderr, "ampkit-launch: every rank finished after %s\n",
                     restarts_text(restarts).c_str());
      return 0;
    }
    if (restartable(r, restarts, o.max_restarts)) {
      std::fprintf(stderr, "ampkit-launch: restart %d of %d: starting %d rank%s again\n", restarts + 1,
                   o.max_restarts, o.nproc, o.nproc == 1 ? "" : "s");
      continue;
    }
    // The last line names the first failure (its rank's own lines are above, prefixed).
    if (r.failed_rank >= 0)
      std::fprintf(stderr, "ampkit-launch: failed: rank %d %s%s; exit code %d\n", r.failed_rank,
                   r.failure.c_str(),
                   restarts > 0 ? (" (after " + restarts_text(restarts) + ")").c_str() : "", r.exit_code);
    return r.exit_code;
  }
}
