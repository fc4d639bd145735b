// Scalers that fail inside their own code, one per FAULTY_MODE (a compile definition): a crash in
// the constructor, a crash in update() at the second step, exit(0) in the constructor, a
// constructor that never returns, _exit(0) in the constructor; after construction: a crash in
// save() or load(), a thread of its own that crashes or calls exit(0), update() that never returns
// (with SIGALRM blocked), throws a std::exception or throws an int, and a static initializer that
// crashes only in the host (not in the registry's probe child), and one that throws an int. The host must
// name the plugin and the call, exit 3, never die silently or hang (plugin_call.h, guarded_strategies.h).
#include <ampkit/scaler_plugin.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

int* volatile nowhere = nullptr;

#if FAULTY_MODE == 15
// A static initializer that throws an int: std::terminate while the library is being loaded.
struct ThrowWhileLoading {
  ThrowWhileLoading() { throw 42; }
} throw_while_loading;
#endif

#if FAULTY_MODE == 14
// The probe's child is a fork of the host, so its parent is the host; the host's is a shell.
struct CrashOutsideTheProbe {
  CrashOutsideTheProbe() {
    std::ifstream comm("/proc/" + std::to_string(::getppid()) + "/comm");
    std::string parent;
    std::getline(comm, parent);
    if (parent.rfind("ampkit-", 0) != 0) *nowhere = 1;
  }
} crash_outside_the_probe;
#endif

class FaultyScaler final : public ampkit::LossScaler {
 public:
  explicit FaultyScaler(const ampkit::OptionValues&) {
#if FAULTY_MODE == 1
    *nowhere = 1;
#elif FAULTY_MODE == 3
    std::exit(0);
#elif FAULTY_MODE == 4
    for (;;) ::pause();
#elif FAULTY_MODE == 5
    ::_exit(0);
#endif
  }
  ~FaultyScaler() override {
    if (thread_.joinable()) thread_.detach();
  }
  void start(const ampkit::RunInfo&) override {
#if FAULTY_MODE == 8 || FAULTY_MODE == 9
    thread_ = std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
#if FAULTY_MODE == 8
      *nowhere = 1;
#else
      std::exit(0);
#endif
    });
#endif
  }
  ampkit::State save() const override {
#if FAULTY_MODE == 6
    *nowhere = 1;
#endif
    return {};
  }
  void load(const ampkit::State&) override {
#if FAULTY_MODE == 7
    *nowhere = 1;
#endif
  }
  double scale() const override {
    return 1.0;
  }
  void update(const ampkit::StepStats& s) override {
#if FAULTY_MODE == 2
    if (s.step == 1) *nowhere = 1;
#elif FAULTY_MODE == 10
    if (s.step == 1) {
      sigset_t alarm;
      sigemptyset(&alarm);
      sigaddset(&alarm, SIGALRM);
      pthread_sigmask(SIG_BLOCK, &alarm, nullptr);
      for (;;) ::pause();
    }
#elif FAULTY_MODE == 11
    if (s.step == 1) throw std::runtime_error("the faulty scaler gave up");
#elif FAULTY_MODE == 12
    if (s.step == 1) throw 42;
#endif
    (void)s;
  }

 private:
  std::thread thread_;
};

}  // namespace

// growth_interval does nothing: it gives tests an option to replace at run time
// (ampkit.GradScaler.set_growth_interval remakes the plugin, which must stay guarded).
AMPKIT_PLUGIN(
    scaler, FAULTY_NAME, FaultyScaler, "Test scaler that fails inside its own code",
    ampkit::OptionSpec::Int("growth_interval", "2000", "Unused; replaced by tests at run time.").min(1))
