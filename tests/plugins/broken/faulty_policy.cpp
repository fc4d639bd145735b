// A NaN policy whose decide() never returns at the second step: the host's watchdog must end the
// run within --plugin-timeout, naming the plugin and the call (plugin_call.h).
#include <ampkit/nan_policy_plugin.h>
#include <unistd.h>

namespace {

class HangingPolicy final : public ampkit::NanPolicy {
 public:
  explicit HangingPolicy(const ampkit::OptionValues&) {}
  ampkit::NanDecision decide(const ampkit::StepStats& s) override {
    if (s.step == 1)
      for (;;) ::pause();
    return {};
  }
};

}  // namespace

AMPKIT_PLUGIN(nan_policy, decide_hang, HangingPolicy, "Test NaN policy that hangs in decide()")
