// Clipper "norm": torch.nn.utils.clip_grad_norm_ semantics on the unscaled total norm.
#include <ampkit/clipper_plugin.h>
#include <ampkit/device_rules.h>
#include <ampkit/step_rules.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace {

class NormGradClipper final : public ampkit::GradClipper {
 public:
  explicit NormGradClipper(const ampkit::OptionValues& options)
      : max_norm_(options.get_float("max_norm", 0.0)), inf_norm_(options.get_string("norm_type") == "inf") {
    // The host fills max_norm from the per-precision default; only a host that resolved options
    // without the run's precision (and no explicit value) gets here without one.
    if (!options.has("max_norm"))
      throw std::invalid_argument(
          "clipper 'norm' needs max_norm: set its option max_norm, or resolve its options with the run's "
          "precision (OptionInputs::precision) to get the per-precision default");
    rule_.kind = ampkit::ClipperDeviceRule::Kind::norm;
    rule_.max_norm = max_norm_;
    rule_.inf_norm = inf_norm_;
  }

  // clip() below, as numbers for the device (device_rules.h), which runs the same function.
  void* find_function(const char* name) override {
    return ampkit::offer_rule(name, ampkit::kClipperDeviceRule, &rule_);
  }

  ampkit::ClipResult clip(const ampkit::StepStats& stats) override {
    const double total = inf_norm_ ? stats.grad_max_abs : stats.grad_norm;
    // torch's clip_coef, clamped to 1: the rule the device runs too (step_rules.h).
    return {ampkit_norm_clip_coefficient(max_norm_, total), max_norm_};
  }

 private:
  double max_norm_;
  bool inf_norm_;
  ampkit::ClipperDeviceRule rule_;
};

}  // namespace

AMPKIT_PLUGIN(clipper, norm, NormGradClipper,
              "Scale all gradients down when their total norm exceeds max_norm (clip_grad_norm_)",
              // fp16 gradients are noisier and closer to overflow, so the usual starting points
              // differ by precision (see docs/gradient-clipping.md).
              ampkit::OptionSpec::Float("max_norm", "fp16=1;bf16=5;fp32=10",
                                        "Largest allowed total norm of the unscaled gradients; "
                                        "the default depends on the run's precision.")
                  .per_precision()
                  .min(0.0, true),
              ampkit::OptionSpec::Choice("norm_type", "2", "2|inf",
                                         "Norm of the concatenated gradients: 2 (L2) or inf "
                                         "(largest absolute element)."))
