// Unit test of the ema_norm clipper without any ampkit host: the plugin's object files are linked
// in, ampkit/testing.h builds the clipper from its descriptor as the host would (declared
// defaults, then the overrides, each checked) and the test drives clip/save/load.
#include <ampkit/grad_clipper.h>
#include <ampkit/testing.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

AMPKIT_TESTING_DECLARE(clipper, ema_norm);

namespace {

const ampkit_plugin_descriptor& descriptor() {
  return AMPKIT_TESTING_DESCRIPTOR(clipper, ema_norm);
}

std::unique_ptr<ampkit::GradClipper> make(const std::map<std::string, std::string>& given = {}) {
  return ampkit::testing::make<ampkit::GradClipper>(descriptor(), given);
}

ampkit::StepStats norm(double value) {
  ampkit::StepStats s;
  s.grad_norm = value;
  return s;
}

}  // namespace

int main() {
  const ampkit_plugin_descriptor& d = descriptor();
  AMPKIT_CHECK(d.abi_version == AMPKIT_ABI_VERSION);
  AMPKIT_CHECK(std::string(d.kind) == "clipper");
  AMPKIT_CHECK(std::string(d.name) == "ema_norm");
  AMPKIT_CHECK(d.option_count == 3u);

  auto clipper = make({{"warmup_steps", "2"}, {"factor", "2"}, {"beta", "0.5"}});
  AMPKIT_CHECK(clipper != nullptr);
  if (!clipper) return 1;
  // Warm-up: no clipping, the average becomes the mean of 1 and 3.
  AMPKIT_CHECK(clipper->clip(norm(1.0)).coefficient == 1.0);
  AMPKIT_CHECK(clipper->clip(norm(3.0)).coefficient == 1.0);
  // Threshold 2 x 2 = 4: a norm of 8 is scaled by 4 / (8 + 1e-6).
  const ampkit::ClipResult spike = clipper->clip(norm(8.0));
  AMPKIT_CHECK(spike.threshold == 4.0);
  AMPKIT_CHECK(std::fabs(spike.coefficient - 4.0 / (8.0 + 1e-6)) < 1e-15);
  // The average moved towards the clipped norm 4, not towards 8: 0.5 x 2 + 0.5 x 4 = 3.
  AMPKIT_CHECK(clipper->clip(norm(1.0)).threshold == 6.0);

  // save() then load() into a fresh clipper continues identically.
  auto resumed = make({{"warmup_steps", "2"}, {"factor", "2"}, {"beta", "0.5"}});
  resumed->load(clipper->save());
  AMPKIT_CHECK(resumed->clip(norm(5.0)).threshold == clipper->clip(norm(5.0)).threshold);
  AMPKIT_CHECK(resumed->save() == clipper->save());

  // Options are checked as the host checks them: beta must be in (0, 1).
  bool range_refused = false;
  try {
    make({{"beta", "1.5"}});
  } catch (const std::invalid_argument& e) {
    range_refused = std::string(e.what()).find("'beta'") != std::string::npos;
  }
  AMPKIT_CHECK(range_refused);

  // A state this plugin never writes is refused with a message, not used.
  ampkit::State bad;
  bad.set("average", -1.0);
  bad.set("seen", int64_t{3});
  bool refused = false;
  try {
    resumed->load(bad);
  } catch (const std::exception& e) {
    refused = std::string(e.what()).find("clipper 'ema_norm'") != std::string::npos;
  }
  AMPKIT_CHECK(refused);

  return ampkit::testing::finish("test_ema_clipper");
}
