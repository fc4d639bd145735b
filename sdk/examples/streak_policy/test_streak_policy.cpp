// Unit test of the bad_streak NaN policy without any ampkit host (ampkit/testing.h).
#include <ampkit/nan_policy.h>
#include <ampkit/testing.h>

#include <cstdio>
#include <string>

AMPKIT_TESTING_DECLARE(nan_policy, bad_streak);

namespace {

int failures = 0;

#define CHECK(condition)                                                                 \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      ++failures;                                                                        \
    }                                                                                    \
  } while (0)

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
  CHECK(std::string(d.kind) == "nan_policy");
  CHECK(d.option_count == 3u);

  // The declared defaults: max_streak 5.
  auto policy = testing::make<ampkit::NanPolicy>(d);
  CHECK(policy->decide(testing::step(0, 1.0)).action == NanAction::proceed);
  for (int64_t i = 0; i < 4; ++i) CHECK(policy->decide(bad(1 + i, i)).action == NanAction::skip);
  const ampkit::NanDecision fifth = policy->decide(bad(5, 4));
  CHECK(fifth.action == NanAction::abort);
  CHECK(fifth.reason == "5 bad steps in a row (max_streak 5)");

  // The fraction rule, judged from min_steps on: 3 bad of 10 > 0.25.
  auto strict = testing::make<ampkit::NanPolicy>(d, {{"max_fraction", "0.25"}, {"min_steps", "10"}});
  for (int64_t i = 0; i < 7; ++i) CHECK(strict->decide(testing::step(i, 1.0)).action == NanAction::proceed);
  CHECK(strict->decide(bad(7, 0)).action == NanAction::skip);
  CHECK(strict->decide(bad(8, 0)).action == NanAction::skip);
  const ampkit::NanDecision third = strict->decide(bad(9, 0));
  CHECK(third.action == NanAction::abort);
  CHECK(third.reason == "3 of 10 steps were bad (max_fraction 0.25)");

  // save() + load() continues with the same counts.
  auto resumed = testing::make<ampkit::NanPolicy>(d, {{"max_fraction", "0.25"}, {"min_steps", "10"}});
  resumed->load(strict->save());
  CHECK(resumed->save() == strict->save());

  // Bad option values are refused as the host refuses them.
  bool refused = false;
  try {
    testing::make<ampkit::NanPolicy>(d, {{"max_streak", "0"}});
  } catch (const std::invalid_argument& e) {
    refused = std::string(e.what()).find("'max_streak'") != std::string::npos;
  }
  CHECK(refused);

  std::printf("test_streak_policy: %s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
