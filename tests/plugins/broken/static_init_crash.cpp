// A valid plugin that dies with SIGSEGV in a static initializer, i.e. inside dlopen itself.
#include <signal.h>

#include "broken_scaler.h"

namespace {

struct CrashOnLoad {
  CrashOnLoad() { ::raise(SIGSEGV); }
};
CrashOnLoad crash_on_load;

}  // namespace

AMPKIT_PLUGIN(scaler, static_init_crash, broken::ConstantScaler, "Test plugin that crashes when loaded")
