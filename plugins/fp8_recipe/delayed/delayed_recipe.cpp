// fp8 recipe "delayed": Transformer Engine's DelayedScaling, each scale from a window of past amaxes.
#include <ampkit/fp8_recipe_plugin.h>

#include "../fp8_recipe_rules.h"

namespace {

// Transformer Engine's fused amax_and_scale_update: A is the window's maximum (max) or this step's
// amax (most_recent); the rest is every windowed recipe's (fp8_recipe_rules.h).
class DelayedRecipe final : public ampkit::fp8::WindowedRecipe {
 public:
  explicit DelayedRecipe(const ampkit::OptionValues& options)
      : WindowedRecipe("delayed", options),
        most_recent_(options.get_string("amax_compute_algo") == "most_recent") {}

 private:
  float estimate(const float* row, float latest) const override {
    return most_recent_ ? latest : ampkit::fp8::row_max(row, window());
  }

  bool most_recent_;
};

}  // namespace

AMPKIT_PLUGIN(fp8_recipe, delayed, DelayedRecipe,
              "Transformer Engine's delayed fp8 scaling: each scale from the largest of the last amaxes",
              ampkit::OptionSpec::Int("amax_history_len", "1024",
                                      "How many past amaxes per tensor the scale is computed from "
                                      "(Transformer Engine's default).")
                  .min(1)
                  .max(65536),
              ampkit::OptionSpec::Choice("amax_compute_algo", "max", "max|most_recent",
                                         "Amax a scale is computed from: the largest in the window (max) "
                                         "or this step's (most_recent)."),
              ampkit::OptionSpec::Int("margin", "0",
                                      "Scales are divided by 2**margin, leaving that many binades of "
                                      "headroom above the amax.")
                  .min(-64)
                  .max(64),
              ampkit::OptionSpec::Choice("format", "hybrid", "hybrid|e4m3",
                                         "fp8 formats: hybrid casts input and weight to e4m3 and grad_output "
                                         "to e5m2 (Transformer Engine's default); e4m3 casts all three to "
                                         "e4m3."))
