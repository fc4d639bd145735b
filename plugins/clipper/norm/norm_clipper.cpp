// Clipper "norm": torch.nn.utils.clip_grad_norm_ semantics on the unscaled total norm.
#include <cmath>
#include <limits>

#include <ampkit/plugin.h>

namespace {

class NormGradClipper final : public ampkit::GradClipper {
 public:
  explicit NormGradClipper(const ampkit::OptionValues& options)
      : explicit_max_norm_(options.has("max_norm")),
        max_norm_(options.get_float("max_norm", 0.0)),
        inf_norm_(options.get_string("norm_type") == "inf") {}

  // Without an explicit max_norm the threshold depends on the precision: fp16 gradients are
  // noisier and closer to overflow, so the usual starting points differ (see gradient-clipping.md).
  void start(const ampkit::RunInfo& info) override {
    if (explicit_max_norm_) return;
    switch (info.precision) {
      case ampkit::Precision::fp16: max_norm_ = 1.0; break;
      case ampkit::Precision::bf16: max_norm_ = 5.0; break;
      case ampkit::Precision::fp32: max_norm_ = 10.0; break;
    }
  }

  ampkit::ClipResult clip(const ampkit::StepStats& stats) override {
    const double total = inf_norm_ ? stats.grad_max_abs : stats.grad_norm;
    // Same expression as torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.
    const double coef = max_norm_ / (total + 1e-6);
    return {coef < 1.0 ? coef : 1.0, max_norm_};
  }

 private:
  bool explicit_max_norm_;
  double max_norm_;
  bool inf_norm_;
};

}  // namespace

AMPKIT_PLUGIN(clipper, norm, NormGradClipper,
              "Scale all gradients down when their total norm exceeds max_norm (clip_grad_norm_)",
              ampkit::OptionSpec::Float("max_norm", nullptr,
                                        "Largest allowed total norm of the unscaled gradients; "
                                        "unset: 1.0 for fp16, 5.0 for bf16, 10.0 for fp32.")
                  .min(0.0, true),
              ampkit::OptionSpec::Choice("norm_type", "2", "2|inf",
                                         "Norm of the concatenated gradients: 2 (L2) or inf "
                                         "(largest absolute element)."))
