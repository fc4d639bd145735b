// fp8 recipe "delayed": Transformer Engine's DelayedScaling, each scale from a window of past amaxes.
#include <ampkit/fp8_recipe_plugin.h>

#include <cstdint>
#include <string>

#include "../fp8_recipe_rules.h"

namespace {

class DelayedRecipe final : public ampkit::Fp8Recipe {
 public:
  explicit DelayedRecipe(const ampkit::OptionValues& options)
      : hybrid_(ampkit::fp8::hybrid_format("delayed", options)),
        window_(options.get_int("amax_history_len")),
        margin_(options.get_int("margin")),
        most_recent_(options.get_string("amax_compute_algo") == "most_recent") {}
  int64_t history_length() const override { return window_; }
  const char* format(int64_t role) const override { return ampkit::fp8::role_format(role, hybrid_); }
  // Per tensor, as TE's fused amax_and_scale_update: a zero amax changes nothing; otherwise it
  // enters the window (the oldest leaves) and the next scale is float32(fp8_max * 2**-margin) / A,
  // one float32 division, A the window's maximum (max) or this amax (most_recent).
  int64_t update(int64_t n, const int64_t* roles, const float* amax, float* history, float* scale) override {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float numerator = ampkit::fp8::scaled_max(format(roles[i]), margin_);
      if (!ampkit::fp8::usable_amax(amax[i])) {
        ++bad;  // never enters the window: TE's would hold an inf for window_ steps
        continue;
      }
      if (amax[i] == 0.0f) continue;
      float* row = history + i * window_;
      ampkit::fp8::push_amax(row, window_, amax[i]);
      const float a = most_recent_ ? amax[i] : ampkit::fp8::row_max(row, window_);
      scale[i] = ampkit::fp8::scale_for(numerator, a);
    }
    return bad;
  }
  ampkit::State save() const override { return ampkit::fp8::history_state(window_); }
  void load(const ampkit::State& state) override {
    ampkit::fp8::check_history_state("delayed", state, window_);
  }

 private:
  bool hybrid_;
  int64_t window_;
  int64_t margin_;
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
