// fp8 recipe "predictive": delayed scaling that also forecasts a growing amax from the window's trend.
#include <ampkit/fp8_recipe_plugin.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "../fp8_recipe_rules.h"

namespace {

// A delayed recipe's scale follows the largest recent amax, so an amax that grows step after step
// is always one step ahead of its scale and saturates. This one estimates the next amax as
//   max(A, amax * g)
// with A the window's maximum (delayed's max) and g the largest step-to-step growth among the
// last `trend_steps` pairs of consecutive amaxes in the window, clamped to [1, max_growth]. A
// stable or shrinking amax has g = 1, and the scale is delayed's.
class PredictiveRecipe final : public ampkit::fp8::WindowedRecipe {
 public:
  explicit PredictiveRecipe(const ampkit::OptionValues& options)
      : WindowedRecipe("predictive", options),
        trend_(options.get_int("trend_steps")),
        max_growth_(static_cast<float>(options.get_float("max_growth"))) {
    if (window() < 2)
      throw ampkit::option_error("fp8_recipe 'predictive'", "amax_history_len", std::to_string(window()),
                                 ">= 2 (a trend needs two amaxes)");
  }

 private:
  float estimate(const float* row, float latest) const override {
    float forecast = latest * growth(row);
    if (!std::isfinite(forecast)) forecast = FLT_MAX;
    const float a = ampkit::fp8::row_max(row, window());
    return forecast > a ? forecast : a;
  }

  // The largest row[j] / row[j + 1] (newer over older, one float32 division each) for j below
  // trend_steps, over pairs whose older amax is > 0, clamped to [1, max_growth].
  float growth(const float* row) const {
    float g = 1.0f;
    for (int64_t j = 0; j < trend_ && j + 1 < window(); ++j)
      if (row[j + 1] > 0.0f) {
        const float r = row[j] / row[j + 1];
        g = r > g ? r : g;
      }
    return g < max_growth_ ? g : max_growth_;
  }

  int64_t trend_;
  float max_growth_;
};

}  // namespace

AMPKIT_PLUGIN(fp8_recipe, predictive, PredictiveRecipe,
              "Delayed fp8 scaling that forecasts a growing amax from the window's trend",
              ampkit::OptionSpec::Int("amax_history_len", "1024",
                                      "How many past amaxes per tensor the scale is computed from.")
                  .min(2)
                  .max(65536),
              ampkit::OptionSpec::Int("trend_steps", "16",
                                      "How many of the latest step-to-step amax ratios the growth "
                                      "forecast looks at.")
                  .min(1)
                  .max(65535),
              ampkit::OptionSpec::Float("max_growth", "4",
                                        "Largest step-to-step growth of the amax the forecast assumes.")
                  .min(1.0)
                  .max(65536.0),
              ampkit::OptionSpec::Int("margin", "0",
                                      "Scales are divided by 2**margin, leaving that many binades of "
                                      "headroom above the estimate.")
                  .min(-64)
                  .max(64),
              ampkit::OptionSpec::Choice("format", "hybrid", "hybrid|e4m3",
                                         "fp8 formats: hybrid casts input and weight to e4m3 and grad_output "
                                         "to e5m2; e4m3 casts all three to e4m3."))
