// Clipper "adaptive": a norm threshold learned from the history of unscaled gradient norms
// (AutoClip's percentile, or ZClip's z-score of an EMA).
//
// method=percentile follows AutoClip (Seetharaman et al. 2020, github.com/pseeth/autoclip,
// autoclip.py): append this step's norm to the history, threshold = np.percentile(history, p)
// (linear interpolation), then clip_grad_norm_(threshold). The paper keeps every norm; we keep
// the last `history` (as the later autoclip package's QuantileClip does, default 1000 there too).
//
// method=zscore follows ZClip (Kumar et al. 2025, github.com/bluorion-com/ZClip, zclip.py,
// mode="zscore", clip_option="adaptive_scaling"): warm-up collects norms, then mean/var are EMAs;
// a norm with z = (g - mean) / (std + eps) > z_thresh is clipped to
// mean + z_thresh * std / (z / z_thresh), and the EMA is updated with the clipped norm.
//
// Both give one coefficient for all gradients, so they stay in the engine's single multiply.
#include <ampkit/clipper_plugin.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// numpy.percentile(values, p) with its default method="linear", step for step (numpy's _lerp
// switches to `b - (b - a) * (1 - t)` for t >= 0.5), so the thresholds equal AutoClip's.
double numpy_percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  const double index = (n - 1) * (p / 100.0);
  if (index >= n - 1) return values.back();
  if (index < 0) return values.front();
  const double below = std::floor(index);
  const double t = index - below;
  const double a = values[static_cast<size_t>(below)];
  const double b = values[static_cast<size_t>(below) + 1];
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

// torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6), clamped to 1.
double clip_grad_norm_coefficient(double max_norm, double norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

class AdaptiveGradClipper final : public ampkit::GradClipper {
 public:
  explicit AdaptiveGradClipper(const ampkit::OptionValues& options)
      : zscore_(options.get_string("method") == "zscore"),
        percentile_(options.get_float("percentile")),
        history_size_(options.get_int("history")),
        alpha_(options.get_float("alpha")),
        z_thresh_(options.get_float("z_thresh")),
        warmup_steps_(options.get_int("warmup_steps")),
        clip_factor_(options.get_float("clip_factor")),
        has_max_norm_(options.has("max_norm")),
        max_norm_(options.get_float("max_norm", 0.0)) {}

  ampkit::ClipResult clip(const ampkit::StepStats& stats) override {
    return zscore_ ? clip_zscore(stats.grad_norm) : clip_percentile(stats.grad_norm);
  }

  ampkit::State save() const override {
    ampkit::State s;
    s.set("method", zscore_ ? "zscore" : "percentile");
    s.set("history", std::vector<double>(history_.begin(), history_.end()));
    s.set("warmup_norms", warmup_norms_);
    s.set("initialized", initialized_);
    s.set("mean", mean_);
    s.set("var", var_);
    return s;
  }

  void load(const ampkit::State& state) override {
    const std::string& method = state.get<std::string>("method");
    if (method != (zscore_ ? "zscore" : "percentile"))
      throw std::invalid_argument("clipper 'adaptive': the checkpoint holds the state of method=" + method +
                                  ", this run uses method=" + (zscore_ ? "zscore" : "percentile"));
    const auto& history = state.get<std::vector<double>>("history");
    // A smaller `history` on resume keeps the newest norms, as if the run had used it throughout.
    const size_t keep = std::min(history.size(), static_cast<size_t>(history_size_));
    history_.assign(history.end() - static_cast<std::ptrdiff_t>(keep), history.end());
    warmup_norms_ = state.get<std::vector<double>>("warmup_norms");
    initialized_ = state.get<bool>("initialized");
    mean_ = state.get<double>("mean");
    var_ = state.get<double>("var");
  }

 private:
  // ZClip's eps in z = (g - mean) / (std + eps): only guards std == 0 (constant norms).
  static constexpr double kEps = 1e-6;

  ampkit::ClipResult clip_percentile(double norm) {
    // AutoClip appends first: the current norm takes part in its own threshold.
    history_.push_back(norm);
    while (static_cast<int64_t>(history_.size()) > history_size_) history_.pop_front();
    double threshold = numpy_percentile(std::vector<double>(history_.begin(), history_.end()), percentile_);
    if (has_max_norm_) threshold = std::min(threshold, max_norm_);
    return {clip_grad_norm_coefficient(threshold, norm), threshold};
  }

  ampkit::ClipResult clip_zscore(double norm) {
    if (!initialized_) {
      // Warm-up: collect norms, clip only to the optional fixed bound (as ZClip does).
      warmup_norms_.push_back(norm);
      if (static_cast<int64_t>(warmup_norms_.size()) >= warmup_steps_) initialize_ema();
      if (has_max_norm_) return {clip_grad_norm_coefficient(max_norm_, norm), max_norm_};
      return {1.0, 0.0};
    }
    const double std_dev = std::sqrt(var_);
    const double z = (norm - mean_) / (std_dev + kEps);
    // The norm a spike is clipped to; shown as the threshold on steps that are not spikes.
    double boundary = mean_ + z_thresh_ * (std_dev + kEps);
    bool spike = false;
    double clip_value = norm;
    if (z > z_thresh_) {
      // Adaptive scaling: the larger the outlier, the harder it is pulled back (eta = z / z_thresh).
      const double eta = z / z_thresh_;
      clip_value = (mean_ + (z_thresh_ * std_dev) / eta) * clip_factor_;
      spike = true;
    }
    const double effective = has_max_norm_ ? std::min(clip_value, max_norm_) : clip_value;
    // ZClip's apply_in_place_clipping: clip only when strictly above, with clip_grad_norm_'s 1e-6.
    const double coefficient = norm > effective ? effective / (norm + 1e-6) : 1.0;
    // The EMA follows the clipped norm (not max_norm's), so one spike does not inflate the baseline.
    update_ema(clip_value);
    if (spike || coefficient < 1.0) return {coefficient, effective};
    if (has_max_norm_) boundary = std::min(boundary, max_norm_);
    return {coefficient, boundary};
  }

  void initialize_ema() {
    // Summed in order, as Python's sum() in ZClip._initialize_ema does.
    double sum = 0.0;
    for (double x : warmup_norms_) sum += x;
    mean_ = sum / static_cast<double>(warmup_norms_.size());
    double squares = 0.0;
    for (double x : warmup_norms_) squares += (x - mean_) * (x - mean_);
    var_ = squares / static_cast<double>(warmup_norms_.size());
    initialized_ = true;
    warmup_norms_.clear();
  }

  void update_ema(double x) {
    mean_ = alpha_ * mean_ + (1 - alpha_) * x;
    const double d = x - mean_;  // ZClip takes the deviation from the new mean
    var_ = alpha_ * var_ + (1 - alpha_) * (d * d);
  }

  bool zscore_;
  double percentile_;
  int64_t history_size_;
  double alpha_;
  double z_thresh_;
  int64_t warmup_steps_;
  double clip_factor_;
  bool has_max_norm_;
  double max_norm_;

  std::deque<double> history_;        // percentile: the last `history` norms
  std::vector<double> warmup_norms_;  // zscore: norms seen before the EMA starts
  bool initialized_ = false;
  double mean_ = 0.0;
  double var_ = 0.0;
};

}  // namespace

AMPKIT_PLUGIN(
    clipper, adaptive, AdaptiveGradClipper,
    "Clip the total norm to a threshold learned from past norms (AutoClip percentile, ZClip z-score)",
    ampkit::OptionSpec::Choice("method", "zscore", "percentile|zscore",
                               "percentile: AutoClip, threshold = a percentile of past "
                               "norms; zscore: ZClip, clip only norms far above their EMA."),
    ampkit::OptionSpec::Float("percentile", "10",
                              "method=percentile: percentile p of the norm history used "
                              "as threshold (AutoClip's code uses 10).")
        .min(0.0)
        .max(100.0),
    ampkit::OptionSpec::Int("history", "1000",
                            "method=percentile: number of most recent norms kept (the "
                            "paper keeps all; the autoclip package keeps 1000).")
        .min(1.0),
    ampkit::OptionSpec::Float("alpha", "0.97",
                              "method=zscore: EMA smoothing of the norm's mean and "
                              "variance (ZClip's default; lower reacts faster).")
        .min(0.0, true)
        .max(1.0, true),
    ampkit::OptionSpec::Float("z_thresh", "2.5",
                              "method=zscore: z-score above which a norm is a spike and "
                              "is clipped (ZClip's default).")
        .min(0.0, true),
    ampkit::OptionSpec::Int("warmup_steps", "25",
                            "method=zscore: steps that only collect norms before the "
                            "EMA starts from their mean and variance (ZClip's default).")
        .min(1.0),
    ampkit::OptionSpec::Float("clip_factor", "1.0",
                              "method=zscore: multiplier of the adaptive threshold; "
                              "0.3-0.7 clips harder (ZClip's default 1.0).")
        .min(0.0, true),
    // 10x norm's max_norm per precision: a safety net above every healthy norm measured
    // (docs/gradient-clipping.md, "Defaults per precision"); 3e38 turns it off.
    ampkit::OptionSpec::Float("max_norm", "fp16=10;bf16=50;fp32=100",
                              "Upper bound of the threshold, as ZClip's max_grad_norm "
                              "(also applied during warm-up); 3e38: no bound.")
        .per_precision()
        .min(0.0, true))
