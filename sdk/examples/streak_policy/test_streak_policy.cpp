// Unit test of the bad_streak NaN policy without any ampkit host (ampkit/testing.h).
#include <ampkit/nan_policy.h>
#include <ampkit/testing.h>

#include <cstdio>
#include <string>

AMPKIT_TESTING_DECLARE(nan_policy, bad_streak);

namespace {

using ampkit::NanAction;
namespace testing = ampkit::testing;

ampkit::StepStats bad(int64_t step, int64_t streak_before) {
  ampkit::StepStats s = testing::overflow(step);
  s.consecutive_skips = streak_before;
  return s;
}

}  // namespace

int main() {
  const ampkit_plugin_descriptor& d = AMPKIT_TESTING_DESCRIPTOR(nan_policy, bad_streak);
  AMPKIT_CHECK(std::string(d.kind) == "nan_policy");
  AMPKIT_CHECK(d.option_count == 3u);

  // The declared defaults: max_streak 5.
  auto policy = testing::make<ampkit::NanPolicy>(d);
  AMPKIT_CHECK(policy->decide(testing::step(0, 1.0)).action == NanAction::proceed);
  for (int64_t i = 0; i < 4; ++i) AMPKIT_CHECK(policy->decide(bad(1 + i, i)).action == NanAction::skip);
  const ampkit::NanDecision fifth = policy->decide(bad(5, 4));
  AMPKIT_CHECK(fifth.action == NanAction::abort);
  AMPKIT_CHECK(fifth.reason == "5 bad steps in a row (max_streak 5)");

  // The fraction rule, judged from min_steps on: 3 bad of 10 > 0.25.
  auto strict = testing::make<ampkit::NanPolicy>(d, {{"max_fraction", "0.25"}, {"min_steps", "10"}});
  for (int64_t i = 0; i < 7; ++i)
    AMPKIT_CHECK(strict->decide(testing::step(i, 1.0)).action == NanAction::proceed);
  AMPKIT_CHECK(strict->decide(bad(7, 0)).action == NanAction::skip);
  AMPKIT_CHECK(strict->decide(bad(8, 0)).action == NanAction::skip);
  const ampkit::NanDecision third = strict->decide(bad(9, 0));
  AMPKIT_CHECK(third.action == NanAction::abort);
  AMPKIT_CHECK(third.reason == "3 of 10 steps were bad (max_fraction 0.25)");

  // save() + load() continues with the same counts.
  auto resumed = testing::make<ampkit::NanPolicy>(d, {{"max_fraction", "0.25"}, {"min_steps", "10"}});
  resumed->load(strict->save());
  AMPKIT_CHECK(resumed->save() == strict->save());

  // Bad option values are refused as the host refuses them.
  bool refused = false;
  try {
    testing::make<ampkit::NanPolicy>(d, {{"max_streak", "0"}});
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("'max_streak'") != std::string::npos;
  }
  AMPKIT_CHECK(refused);

  return ampkit::testing::finish("test_streak_policy");
}
