// A NaN policy that answers `action` (a NanAction's number: 3 rollback with no rollback plan, 4
// abort, 77 none at all) from step `from_step` on, and skips bad steps before. It declares a device
// rule that never aborts, so the deferred step runs with it: the host must refuse an answer it
// cannot carry out as this plugin's fault (guarded_strategies.h), and take an abort as one.
#include <ampkit/device_rules.h>
#include <ampkit/nan_policy_plugin.h>

#include <cstdint>

namespace {

class WrongActionPolicy final : public ampkit::NanPolicy {
 public:
  explicit WrongActionPolicy(const ampkit::OptionValues& options)
      : action_(options.get_int("action")), from_step_(options.get_int("from_step")) {}
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kNanPolicyDeviceRule, &rule_);
  }
  ampkit::NanDecision decide(const ampkit::StepStats& s) override {
    if (s.step >= from_step_) return {static_cast<ampkit::NanAction>(action_), "the test policy's answer"};
    if (s.found_inf) return {ampkit::NanAction::skip, "non-finite"};
    return {};
  }

 private:
  int64_t action_;
  int64_t from_step_;
  ampkit::NanPolicyDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(
    nan_policy, wrong_action, WrongActionPolicy, "Test NaN policy that answers a given action",
    ampkit::OptionSpec::Int("action", "77", "The NanAction number decide() answers.").min(0).max(1000),
    ampkit::OptionSpec::Int("from_step", "2", "The first step it answers it at.").min(0))
