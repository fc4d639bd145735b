// ampkit-train: the reference host; trains a workload with plugins chosen by name at run time.
// Parse -> run the session -> map the outcome to an exit code (docs/configuration.md, "Exit
// codes"); this is the only place that catches errors. The run itself is session/.
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "ampkit/exit_codes.h"
#include "ampkit/plugin_call.h"
#include "config/train_config.h"
#include "session/rank_sync.h"
#include "session/session.h"
#include "session/stop_signals.h"

namespace {

// LibTorch's CPU allocator hands large blocks to glibc, which maps blocks above its mmap threshold
// fresh from the kernel and unmaps them on free: every step's gradients and activations then
// fault in newly zeroed pages (10-13% of a step of a 10M-parameter MLP in the kernel's
// clear_page). Raising the mmap threshold to glibc's maximum and the trim threshold keeps freed
// blocks for reuse: 20% shorter steps there (docs/benchmarks.md); RSS stays at the run's peak
// instead of breathing with each step. A user's own GLIBC_TUNABLES malloc settings win.
void keep_freed_memory_for_reuse() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int run(int argc, const char* const argv[]) {
  keep_freed_memory_for_reuse();
  const ampkit::TrainConfig cfg = ampkit::parse_train_config(argc, argv);
  ampkit::train::install_stop_handlers();
  // A crash, exit() or hang inside plugin code is reported naming the plugin, with exit 3.
  ampkit::install_plugin_fault_reporter("ampkit-train", ampkit::exit_status(ampkit::ExitCode::plugin));
  if (cfg.help) return ampkit::train::print_help(cfg);
  ampkit::train::Session session(cfg);
  return session.run();
}

// A collective failed in a multi-process run: name the lost rank where the heartbeats tell, exit
// 7 at once (destructors of a broken process group can block), never hang.
[[noreturn]] void exit_lost_rank(const std::string& what, bool distributed_error) {
  ampkit::CommBackend* comm = ampkit::train::multi_rank_comm;
  const ampkit::CommFailure why = comm->explain_failure(what);
  const bool lost = why.reason == ampkit::CommFailure::Reason::lost_rank;
  std::fprintf(stderr, "ampkit-train: error: rank %d: %s\n", comm->rank(), why.message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(ampkit::exit_status(lost || distributed_error ? ampkit::ExitCode::distributed
                                                           : ampkit::ExitCode::internal));
}

}  // namespace

// _exit() and _Exit() end the process without atexit hooks, so a plugin calling them would end
// the run with its own status and not a word. The registry binds a plugin's own calls of them (and
// of exit) to the fault reporter (plugin_call.h); these definitions are the second net, for the
// libraries a plugin brings along: exported from the executable (-Wl,--export-dynamic-symbol,
// hosts/train/CMakeLists.txt), so such a call binds to them before libc's: inside a plugin call
// they report it and exit 3; otherwise they are libc's. exit() too: a plugin's thread that calls
// it is reported before any atexit hook or static destructor runs under the threads still
// training; anyone else's exit() is libc's.
extern "C" [[noreturn]] void exit(int status) noexcept {
  ampkit::report_exit_call();
  static const auto libc_exit = reinterpret_cast<void (*)(int)>(::dlsym(RTLD_NEXT, "exit"));
  libc_exit(status);
  __builtin_unreachable();
}
extern "C" [[noreturn]] void _exit(int status) {
  ampkit::end_process(ampkit::report_plugin_exit(status));
}
extern "C" [[noreturn]] void _Exit(int status) noexcept {
  ampkit::end_process(ampkit::report_plugin_exit(status));
}

int main(int argc, char** argv) {
  using ampkit::ExitCode;
  using ampkit::train::multi_rank_comm;
  try {
    return run(argc, argv);
  } catch (const ampkit::Error& e) {
    std::fprintf(stderr, "ampkit-train: error: %s\n", e.what());
    if (multi_rank_comm != nullptr) {  // the other ranks are told by the lost connection
      std::fflush(stderr);
      std::_Exit(ampkit::exit_status(ampkit::exit_code_of(e.category())));
    }
    return ampkit::exit_status(ampkit::exit_code_of(e.category()));
  } catch (const c10::DistError& e) {
    if (multi_rank_comm != nullptr) exit_lost_rank(e.what_without_backtrace(), true);
    std::fprintf(stderr, "ampkit-train: error: %s\n", e.what_without_backtrace());
    return ampkit::exit_status(ExitCode::distributed);
  } catch (const c10::Error& e) {
    if (multi_rank_comm != nullptr) exit_lost_rank(e.what_without_backtrace(), false);
    std::fprintf(stderr, "ampkit-train: LibTorch error: %s\n", e.what_without_backtrace());
    return ampkit::exit_status(ExitCode::internal);
  } catch (const std::exception& e) {
    if (multi_rank_comm != nullptr) exit_lost_rank(e.what(), false);
    std::fprintf(stderr, "ampkit-train: internal error: %s\n", e.what());
    return ampkit::exit_status(ExitCode::internal);
  }
}
