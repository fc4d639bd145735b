// What the fp8 recipes share: each role's format, the amax history's rolling, the float32 scale
// division, the option and state checks. Plain loops over the caller's host arrays.
#pragma once

#include <ampkit/fp8_recipe.h>
#include <ampkit/options.h>
#include <ampkit/state.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

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

}  // namespace ampkit::fp8
