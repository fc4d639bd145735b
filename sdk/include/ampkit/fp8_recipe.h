// Interface of fp8 recipe plugins: how the scales of a model's fp8 casts follow the amaxes observed.
#pragma once

#include <ampkit/layout.h>
#include <ampkit/strategy.h>

#include <cstdint>
#include <cstring>

namespace ampkit {

// The tensors an fp8 linear layer casts; a recipe may treat them differently (format, scale).
enum class Fp8Role : int64_t { input = 0, weight = 1, grad_output = 2 };
inline constexpr int64_t kFp8RoleCount = 3;

// The largest finite value of each fp8 format (torch.finfo(float8_e4m3fn / float8_e5m2).max).
inline constexpr double kFp8E4m3Max = 448.0;
inline constexpr double kFp8E5m2Max = 57344.0;

// The largest finite value of `format` ("e4m3" | "e5m2"); 0 for any other text.
inline double fp8_format_max(const char* format) {
  if (format != nullptr && std::strcmp(format, "e4m3") == 0) return kFp8E4m3Max;
  if (format != nullptr && std::strcmp(format, "e5m2") == 0) return kFp8E5m2Max;
  return 0.0;
}

// A recipe turns observed amaxes (max |x| of the high-precision tensor, before scaling) into the
// scales the next casts multiply by: the cast is (x * scale).clamp(-fp8_max, fp8_max) in the role's
// format. The caller (ampkit.fp8's layers) holds every tensor's amax history and scale in the
// model's buffers, so they are checkpointed with it; a recipe keeps only its own settings and any
// state beyond them (saved by save()).
class AMPKIT_INTERFACE Fp8Recipe : public Strategy {
 public:
  // W, the number of past amaxes the caller keeps per tensor for update(); 0 when none are used.
  virtual int64_t history_length() const = 0;
  // True: each cast computes its scale from the tensor itself, on the tensor's device,
  // scale = fp8_max / max(amax, current_eps()), and update() only records that scale.
  virtual bool current_scaling() const { return false; }
  virtual double current_eps() const { return 0.0; }
  // The format of `role` (an Fp8Role value): "e4m3" or "e5m2", a static string.
  virtual const char* format(int64_t role) const = 0;
  // One step's update of all n tensors of a model at once, on host arrays: roles[n] (Fp8Role
  // values), amax[n] (this step's, reduced across ranks), history[n * W] (row-major, one row per
  // tensor, column 0 the newest amax; zeros where none yet), scale[n] (in: the scale this step cast
  // with; out: the next step's). Returns how many amaxes were not finite: such an amax never
  // enters the history and leaves its tensor's scale alone (the step is a bad step for the
  // caller). Every scale written must be finite and > 0.
  virtual int64_t update(int64_t n, const int64_t* roles, const float* amax, float* history,
                         float* scale) = 0;
};

// AMPKIT_PLUGIN(fp8_recipe, ...) implements this interface; the macro finds it by the kind's name.
namespace interface_of {
using fp8_recipe = Fp8Recipe;
}

}  // namespace ampkit
