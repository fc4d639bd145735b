// Scalers that fail inside their own code, one per FAULTY_MODE (a compile definition): a crash in
// the constructor, a crash in update() at the second step, exit(0) in the constructor, a
// constructor that never returns, and _exit(0) in the constructor. The host must name the plugin and the call, exit 3, never die
// silently or hang (plugin_call.h).
#include <ampkit/scaler_plugin.h>

#include <unistd.h>

#include <cstdlib>

namespace {

int* volatile nowhere = nullptr;

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
  double scale() const override { return 1.0; }
  void update(const ampkit::StepStats& s) override {
#if FAULTY_MODE == 2
    if (s.step == 1) *nowhere = 1;
#endif
    (void)s;
  }
};

}  // namespace

AMPKIT_PLUGIN(scaler, FAULTY_NAME, FaultyScaler, "Test scaler that fails inside its own code")
