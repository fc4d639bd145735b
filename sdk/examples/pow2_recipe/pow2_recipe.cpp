// fp8 recipe "pow2_delayed": delayed scaling whose scales are powers of two. The scale is the
// largest power of two <= fp8_max / A, A the largest of the last `window` amaxes: a cast and its
// dequantisation then only move exponents, so x * scale / scale == x for every x in range (and
// oneDNN's _scaled_mm equals a float32 matmul of the dequantised operands, docs/fp8.md). It costs
// up to one bit of the format's range.
#include <ampkit/fp8_recipe_plugin.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

class Pow2Recipe final : public ampkit::Fp8Recipe {
 public:
  explicit Pow2Recipe(const ampkit::OptionValues& o)
      : window_(o.get_int("window")), hybrid_(o.get_string("format") == "hybrid") {}

  int64_t history_length() const override { return window_; }
  const char* format(int64_t role) const override {
    if (role < 0 || role >= ampkit::kFp8RoleCount)
      throw std::invalid_argument("no fp8 role " + std::to_string(role));
    return hybrid_ && role == static_cast<int64_t>(ampkit::Fp8Role::grad_output) ? "e5m2" : "e4m3";
  }

  // All tensors of a step at once: history[i * window_ ...] is tensor i's row, column 0 newest.
  int64_t update(int64_t n, const int64_t* roles, const float* amax, float* history, float* scale) override {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float fp8_max = static_cast<float>(ampkit::fp8_format_max(format(roles[i])));
      if (!std::isfinite(amax[i]) || amax[i] < 0.0f) {
        ++bad;  // never enters the window; the caller treats the step as bad
        continue;
      }
      if (amax[i] == 0.0f) continue;  // nothing observed: keep window and scale
      float* row = history + i * window_;
      float a = amax[i];
      for (int64_t j = window_ - 1; j > 0; --j) {
        row[j] = row[j - 1];
        a = row[j] > a ? row[j] : a;
      }
      row[0] = amax[i];
      const float s = fp8_max / a;
      int exponent = 0;
      std::frexp(std::isinf(s) ? 0x1p127f : s, &exponent);  // s = m * 2^exponent, m in [0.5, 1)
      scale[i] = std::ldexp(1.0f, exponent - 1);
    }
    return bad;
  }

  // The window's width is what the caller's checkpointed histories hold.
  ampkit::State save() const override {
    ampkit::State s;
    s.set("history_length", window_);
    return s;
  }
  void load(const ampkit::State& state) override {
    if (state.has("history_length") && state.get<int64_t>("history_length") != window_)
      throw std::runtime_error("fp8_recipe 'pow2_delayed': the checkpoint's histories hold " +
                               std::to_string(state.get<int64_t>("history_length")) +
                               " amaxes, this recipe " + std::to_string(window_));
  }

 private:
  int64_t window_;
  bool hybrid_;
};

}  // namespace

AMPKIT_PLUGIN(fp8_recipe, pow2_delayed, Pow2Recipe,
              "Delayed fp8 scaling with power-of-two scales (exact dequantisation)",
              ampkit::OptionSpec::Int("window", "16", "How many past amaxes per tensor the scale follows.")
                  .min(1)
                  .max(4096),
              ampkit::OptionSpec::Choice("format", "hybrid", "hybrid|e4m3",
                                         "hybrid: e4m3 for input and weight, e5m2 for grad_output; e4m3: "
                                         "e4m3 for all three."))
