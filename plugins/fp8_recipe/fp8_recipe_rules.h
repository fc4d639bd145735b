// What the fp8 recipes share: each role's format, the amax history's rolling, the float32 scale
// division, the option and state checks, and the windowed recipes' update. Plain loops over the
// caller's host arrays.
#pragma once

#include <ampkit/fp8_recipe.h>
#include <ampkit/options.h>
#include <ampkit/state.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace ampkit::fp8 {

// "hybrid": e4m3 for input and weight, e5m2 for grad_output (torchao's tensorwise and TE's
// Format.HYBRID); "e4m3": e4m3 for all three.
inline bool hybrid_format(const std::string& recipe, const OptionValues& options) {
  const std::string& f = options.get_string("format");
  if (f != "hybrid" && f != "e4m3")
    throw option_error("fp8_recipe '" + recipe + "'", "format", f, "hybrid or e4m3");
  return f == "hybrid";
}

// The role's format; a role outside input, weight, grad_output is the caller's error.
inline const char* role_format(int64_t role, bool hybrid) {
  if (role < 0 || role >= kFp8RoleCount)
    throw std::invalid_argument("role " + std::to_string(role) +
                                " is not 0 (input), 1 (weight) or 2 (grad_output)");
  return hybrid && role == static_cast<int64_t>(Fp8Role::grad_output) ? "e5m2" : "e4m3";
}

// Whether an amax can be used: finite and >= 0 (an amax is a maximum of absolute values).
inline bool usable_amax(float amax) {
  return std::isfinite(amax) && amax >= 0.0f;
}

// Puts `amax` in column 0 of a history row of w columns; the oldest (column w-1) leaves.
inline void push_amax(float* row, int64_t w, float amax) {
  for (int64_t j = w - 1; j > 0; --j) row[j] = row[j - 1];
  if (w > 0) row[0] = amax;
}

// The largest of a history row (0 for an empty one).
inline float row_max(const float* row, int64_t w) {
  float m = 0.0f;
  for (int64_t j = 0; j < w; ++j) m = row[j] > m ? row[j] : m;
  return m;
}

// fp8_max * 2**-margin in float32: exact, a power of two times 448 or 57344.
inline float scaled_max(const char* format, int64_t margin) {
  return std::ldexp(static_cast<float>(fp8_format_max(format)), static_cast<int>(-margin));
}

// numerator / denominator as one float32 division (denominator > 0); an overflow to inf becomes
// FLT_MAX, as Transformer Engine's update does, so a scale is always finite.
inline float scale_for(float numerator, float denominator) {
  const float s = numerator / denominator;
  return std::isinf(s) ? FLT_MAX : s;
}

// The state every recipe saves: the history width its update() was given, which the caller's
// buffers in a checkpoint have; load() refuses another width, naming both.
inline State history_state(int64_t history_length) {
  State s;
  s.set("history_length", history_length);
  return s;
}
inline void check_history_state(const std::string& recipe, const State& state, int64_t history_length) {
  if (!state.has("history_length")) return;  // written by a recipe without a history (current)
  const int64_t saved = state.get<int64_t>("history_length");
  if (saved != history_length)
    throw std::runtime_error("fp8_recipe '" + recipe + "': the checkpoint's amax histories hold " +
                             std::to_string(saved) + " amaxes per tensor but this recipe keeps " +
                             std::to_string(history_length));
}

// A recipe with a window of past amaxes (delayed, predictive): its formats, margin, window and
// state; a subclass says only which amax a tensor's next scale is computed from. Per tensor i:
// a non-finite or negative amax is counted and changes nothing (it never enters the window:
// Transformer Engine's would hold an inf for a window's length); a zero amax changes nothing
// (nothing observed); otherwise it enters the window (the oldest leaves) and the next scale is
// float32(fp8_max * 2**-margin) / estimate(row, amax), one float32 division.
class WindowedRecipe : public Fp8Recipe {
 public:
  WindowedRecipe(std::string name, const OptionValues& options)
      : name_(std::move(name)),
        hybrid_(hybrid_format(name_, options)),
        window_(options.get_int("amax_history_len")),
        margin_(options.get_int("margin")) {}
  int64_t history_length() const override { return window_; }
  const char* format(int64_t role) const override { return role_format(role, hybrid_); }
  int64_t update(int64_t n, const int64_t* roles, const float* amax, float* history, float* scale) override {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float numerator = scaled_max(format(roles[i]), margin_);  // checks every role
      if (!usable_amax(amax[i])) {
        ++bad;
        continue;
      }
      if (amax[i] == 0.0f) continue;
      float* row = history + i * window_;
      push_amax(row, window_, amax[i]);
      scale[i] = scale_for(numerator, estimate(row, amax[i]));
    }
    return bad;
  }
  State save() const override { return history_state(window_); }
  void load(const State& state) override { check_history_state(name_, state, window_); }

 protected:
  // The amax the next scale is computed from: `row` is the window with `latest` in column 0.
  virtual float estimate(const float* row, float latest) const = 0;
  int64_t window() const { return window_; }

 private:
  std::string name_;
  bool hybrid_;
  int64_t window_;
  int64_t margin_;
};

}  // namespace ampkit::fp8
