// A valid plugin whose static initializer takes 1 s (a slow disk, a large table built at load):
// slow, not hung. Several of them probed together take longer than a limit each one is well within.
#include <chrono>
#include <thread>

#include "broken_scaler.h"

namespace {

struct SlowToLoad {
  SlowToLoad() { std::this_thread::sleep_for(std::chrono::seconds(1)); }
};
SlowToLoad slow_to_load;

}  // namespace

AMPKIT_PLUGIN(scaler, slow_load, broken::ConstantScaler, "Test plugin that takes 1 s to load")
