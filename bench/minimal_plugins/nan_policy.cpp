// A minimal plugin for bench/plugin_compile_time.sh: what compiling one costs.
#include <ampkit/nan_policy_plugin.h>
namespace {
class Strict final : public ampkit::NanPolicy {
 public:
  explicit Strict(const ampkit::OptionValues&) {}
  ampkit::NanDecision decide(const ampkit::StepStats& s) override {
    ampkit::NanDecision d;
    if (s.found_inf) d.action = ampkit::NanAction::abort, d.reason = "non-finite";
    return d;
  }
};
}  // namespace
AMPKIT_PLUGIN(nan_policy, strict, Strict, "Aborts at the first bad step",
              ampkit::OptionSpec::Bool("verbose", "false", "Unused."));
