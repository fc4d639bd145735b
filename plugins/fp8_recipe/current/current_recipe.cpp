// fp8 recipe "current": torchao's tensorwise scaling, each cast scaled by its own tensor's amax.
#include <ampkit/fp8_recipe_plugin.h>

#include <algorithm>
#include <cstdint>

#include "../fp8_recipe_rules.h"

namespace {

// torchao 0.18's float8_utils.EPS: the amax floor, so an all-zero tensor gets a finite scale.
constexpr double kEps = 1e-12;

class CurrentRecipe final : public ampkit::Fp8Recipe {
 public:
  explicit CurrentRecipe(const ampkit::OptionValues& options)
      : hybrid_(ampkit::fp8::hybrid_format("current", options)) {}
  int64_t history_length() const override { return 0; }
  bool current_scaling() const override { return true; }
  double current_eps() const override { return kEps; }
  const char* format(int64_t role) const override { return ampkit::fp8::role_format(role, hybrid_); }
  // The caller computes each cast's scale from the tensor itself; this writes the scale that rule
  // gives the amax handed over: fp8_max / max(amax, 1e-12) in float64, rounded to float32
  // (torchao's amax_to_scale), so the caller can record it and check its own.
  int64_t update(int64_t n, const int64_t* roles, const float* amax, float*, float* scale) override {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double fp8_max = ampkit::fp8_format_max(format(roles[i]));
      if (!ampkit::fp8::usable_amax(amax[i])) {
        ++bad;
        continue;
      }
      scale[i] = static_cast<float>(fp8_max / std::max(static_cast<double>(amax[i]), kEps));
    }
    return bad;
  }
  ampkit::State save() const override { return ampkit::fp8::history_state(0); }
  void load(const ampkit::State& state) override { ampkit::fp8::check_history_state("current", state, 0); }

 private:
  bool hybrid_;
};

}  // namespace

AMPKIT_PLUGIN(fp8_recipe, current, CurrentRecipe,
              "torchao's tensorwise fp8 scaling: each cast scaled by its own tensor's amax",
              ampkit::OptionSpec::Choice("format", "hybrid", "hybrid|e4m3",
                                         "fp8 formats: hybrid casts input and weight to e4m3 and grad_output "
                                         "to e5m2 (torchao's default); e4m3 casts all three to e4m3."))
