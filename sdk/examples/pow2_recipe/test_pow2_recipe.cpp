// Unit test of the pow2_delayed fp8 recipe without any ampkit host (ampkit/testing.h).
#include <ampkit/fp8_recipe.h>
#include <ampkit/testing.h>

#include <cmath>
#include <string>
#include <vector>

AMPKIT_TESTING_DECLARE(fp8_recipe, pow2_delayed);

int main() {
  namespace testing = ampkit::testing;
  const ampkit_plugin_descriptor& d = AMPKIT_TESTING_DESCRIPTOR(fp8_recipe, pow2_delayed);
  AMPKIT_CHECK(std::string(d.kind) == "fp8_recipe");
  AMPKIT_CHECK(d.option_count == 2u);

  auto recipe = testing::make<ampkit::Fp8Recipe>(d, {{"window", "2"}});
  AMPKIT_CHECK(recipe->history_length() == 2);
  AMPKIT_CHECK(std::string(recipe->format(0)) == "e4m3" && std::string(recipe->format(2)) == "e5m2");
  // Two tensors, input and grad_output: 448 / 3 = 149.3 -> 128; 57344 / 3 = 19114.7 -> 16384.
  const std::vector<int64_t> roles = {0, 2};
  std::vector<float> history(4, 0.0f), scale = {1.0f, 1.0f};
  std::vector<float> amax = {3.0f, 3.0f};
  AMPKIT_CHECK(recipe->update(2, roles.data(), amax.data(), history.data(), scale.data()) == 0);
  AMPKIT_CHECK(scale[0] == 128.0f && scale[1] == 16384.0f);
  // The window of 2 keeps 3 for one more step, then forgets it: 448 / 1 = 448 -> 256.
  amax = {1.0f, NAN};
  AMPKIT_CHECK(recipe->update(2, roles.data(), amax.data(), history.data(), scale.data()) == 1);
  AMPKIT_CHECK(scale[0] == 128.0f && scale[1] == 16384.0f);  // the NaN left tensor 1 alone
  AMPKIT_CHECK(history[2] == 3.0f && history[3] == 0.0f);
  AMPKIT_CHECK(recipe->update(2, roles.data(), amax.data(), history.data(), scale.data()) == 1);
  AMPKIT_CHECK(scale[0] == 256.0f);

  // save() + load(): the same width resumes, another is refused.
  auto resumed = testing::make<ampkit::Fp8Recipe>(d, {{"window", "2"}});
  resumed->load(recipe->save());
  AMPKIT_CHECK(resumed->save() == recipe->save());
  bool refused = false;
  try {
    testing::make<ampkit::Fp8Recipe>(d)->load(recipe->save());  // window 16
  } catch (const std::runtime_error& e) {
    refused = std::string(e.what()).find("hold 2 amaxes") != std::string::npos;
  }
  AMPKIT_CHECK(refused);
  return testing::finish("test_pow2_recipe");
}
