// What NaN policies detect, shared by the built-in ones and available to third parties:
// non-finite loss or gradients, and loss / gradient-norm spikes by a rolling z-score.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/nan_policy.h>
#include <ampkit/options.h>
#include <ampkit/state.h>
#include <ampkit/step.h>
#include <ampkit/step_rules.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace ampkit {

// x is a spike when the window holds at least `min_samples` values and x exceeds the window's
// mean by more than `zscore` standard deviations (one-sided: only upward jumps of a loss or a
// norm are failures). Only values judged healthy enter the window, so a spike does not raise
// the bar for the next one.
class SpikeDetector {
 public:
  SpikeDetector(size_t window, double zscore, size_t min_samples)
      : window_(window), zscore_(zscore), min_samples_(min_samples) {}
  bool enabled() const { return window_ > 0 && zscore_ > 0; }
  // z of x against the window; NaN while the window is too short.
  double zscore_of(double x) const {
    if (!enabled() || values_.size() < min_samples_) return NAN;
    double mean = 0;
    for (double v : values_) mean += v;
    mean /= static_cast<double>(values_.size());
    return (x - mean) / sd(mean);
  }
  // The largest value that is not a spike: mean + zscore * sd of the window; NaN while the
  // window is too short.
  double ceiling() const {
    if (!enabled() || values_.size() < min_samples_) return NAN;
    double mean = 0;
    for (double v : values_) mean += v;
    mean /= static_cast<double>(values_.size());
    return mean + zscore_ * sd(mean);
  }
  bool is_spike(double x) const {
    const double z = zscore_of(x);
    return std::isfinite(z) && z > zscore_;
  }
  void add(double x) {
    if (!enabled()) return;
    values_.push_back(x);
    while (values_.size() > window_) values_.pop_front();
  }
  std::vector<double> values() const { return {values_.begin(), values_.end()}; }
  size_t capacity() const { return window_; }
  void set_values(const std::vector<double>& v) {
    values_.assign(v.begin(), v.end());
    while (values_.size() > window_) values_.pop_front();
  }

 private:
  double sd(double mean) const {
    double var = 0;
    for (double v : values_) var += (v - mean) * (v - mean);
    var /= static_cast<double>(values_.size() - 1);
    // A flat window (constant loss) must not turn rounding noise into a spike.
    return std::max(std::sqrt(var), 1e-6 * std::abs(mean) + 1e-12);
  }
  size_t window_;
  double zscore_;
  size_t min_samples_;
  std::deque<double> values_;
};

struct Detection {
  enum class Kind { none, nonfinite_loss, nonfinite_gradients, loss_spike, grad_norm_spike };
  Kind kind = Kind::none;
  std::string what;  // one line: what was seen, with numbers
  bool non_finite() const { return kind == Kind::nonfinite_loss || kind == Kind::nonfinite_gradients; }
  explicit operator bool() const { return kind != Kind::none; }
};

// The options every built-in NaN policy declares for detection (AMPKIT_NAN_DETECTOR_OPTIONS in
// plugin.h lists their specs) and the detector built from them.
class NanDetector {
 public:
  explicit NanDetector(const OptionValues& options)
      : loss_(static_cast<size_t>(options.get_int("spike_window")), options.get_float("spike_zscore"),
              static_cast<size_t>(options.get_int("spike_min_samples"))),
        grad_(static_cast<size_t>(options.get_int("spike_window")), options.get_float("spike_zscore"),
              static_cast<size_t>(options.get_int("spike_min_samples"))) {}

  // Classifies the step; healthy steps feed the spike windows.
  Detection detect(const StepStats& s) {
    Detection d;
    if (!s.loss_finite) {
      d = {Detection::Kind::nonfinite_loss, "non-finite loss (" + number(s.loss) + ")"};
    } else if (s.found_inf) {
      d = {Detection::Kind::nonfinite_gradients, "non-finite gradients at loss scale " + number(s.scale)};
    } else if (loss_.is_spike(s.loss)) {
      d = {Detection::Kind::loss_spike, "loss spike: " + number(s.loss) + " is " +
                                            number(loss_.zscore_of(s.loss)) +
                                            " standard deviations above the recent mean"};
    } else if (grad_.is_spike(s.grad_norm)) {
      d = {Detection::Kind::grad_norm_spike, "gradient-norm spike: " + number(s.grad_norm) + " is " +
                                                 number(grad_.zscore_of(s.grad_norm)) +
                                                 " standard deviations above the recent mean"};
    } else {
      loss_.add(s.loss);
      grad_.add(s.grad_norm);
    }
    return d;
  }

  // A finite spike's recovery by clipping: the gradient norm the step is clipped to, the grad
  // window's mean + zscore * sd (the largest norm the detector calls normal); NaN before the
  // window has spike_min_samples values.
  double grad_norm_ceiling() const { return grad_.ceiling(); }

  void save(State& state) const {
    state.set("loss_window", loss_.values());
    state.set("grad_norm_window", grad_.values());
  }
  // A checkpoint's windows as this run's options bound them: at most spike_window values, each one
  // a run could have put there (finite; a gradient norm >= 0); anything else is refused whole.
  void load(const State& state) {
    const std::vector<double> loss = state.get<std::vector<double>>("loss_window");
    const std::vector<double> grad = state.get<std::vector<double>>("grad_norm_window");
    check_window("loss_window", loss, /*norms=*/false);
    check_window("grad_norm_window", grad, /*norms=*/true);
    loss_.set_values(loss);
    grad_.set_values(grad);
  }

 private:
  void check_window(const char* key, const std::vector<double>& values, bool norms) const {
    if (values.size() > loss_.capacity())
      throw std::runtime_error(
          std::string("checkpoint ") + key + " holds " + std::to_string(values.size()) +
          " values, more than this run's nan_policy.spike_window=" + std::to_string(loss_.capacity()));
    for (const double v : values)
      if (!std::isfinite(v) || (norms && v < 0))
        throw std::runtime_error(
            std::string("checkpoint ") + key + " holds " + number(v) +
            (norms ? ": a window holds finite norms >= 0 only" : ": a window holds finite values only"));
  }
  static std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
  }
  SpikeDetector loss_;
  SpikeDetector grad_;
};

// Base of the built-in policies: the detector (kept in save()/load()) and the streak limit
// Whether a policy built from `options` detects spikes (spike_zscore > 0): its decisions then need
// the recent window, so it offers no device rule (device_rules.h).
inline bool detects_spikes(const OptionValues& options) {
  return options.get_float("spike_zscore") > 0.0;
}

// "abort after max_consecutive bad steps in a row" (0: never).
class DetectingNanPolicy : public NanPolicy {
 public:
  DetectingNanPolicy(const OptionValues& options, int64_t max_consecutive)
      : detector_(options), max_consecutive_(max_consecutive) {}
  State save() const override {
    State s;
    detector_.save(s);
    return s;
  }
  void load(const State& s) override { detector_.load(s); }

 protected:
  Detection detect(const StepStats& s) { return detector_.detect(s); }
  // True (with the abort decision in `out`) when this bad step reaches the streak limit.
  bool streak_limit_reached(const StepStats& s, const Detection& d, NanDecision& out) const {
    if (!ampkit_nan_policy_streak_ends(max_consecutive_, s.consecutive_skips)) return false;
    out = {NanAction::abort, d.what + "; " + std::to_string(s.consecutive_skips + 1) +
                                 " consecutive bad steps (nan_policy.max_consecutive=" +
                                 std::to_string(max_consecutive_) + "): the loss is probably diverging"};
    return true;
  }
  // A detected bad step as `rule` decides it (step_rules.h, the function the policy's device rule
  // runs): skipped, with an extra scaler backoff where the rule says so for a non-finite step, or
  // stopped by the rule's flags or its streak limit. A finite spike counts as a bad step.
  NanDecision decide_by_rule(const ampkit_nan_policy_rule& rule, const StepStats& s,
                             const Detection& d) const {
    const int action = ampkit_nan_policy_decide(&rule, d.kind == Detection::Kind::nonfinite_loss,
                                                d.kind == Detection::Kind::nonfinite_gradients,
                                                !d.non_finite(), s.consecutive_skips);
    NanDecision out{NanAction::skip, d.what};
    if (action == AMPKIT_STEP_SKIP_BACKOFF)
      out = {NanAction::skip_backoff, d.what + "; extra scaler backoff"};
    if (action == AMPKIT_STEP_ABORT && !streak_limit_reached(s, d, out)) out = {NanAction::abort, d.what};
    return out;
  }
  // on_spike=clip: a finite spike (loss or gradient norm) is applied with the gradient norm
  // clipped to the detector's ceiling; non-finite steps are not spikes and return false.
  bool clip_spike(const Detection& d, NanDecision& out) const {
    if (d.kind != Detection::Kind::loss_spike && d.kind != Detection::Kind::grad_norm_spike) return false;
    const double ceiling = detector_.grad_norm_ceiling();
    if (!(ceiling > 0) || !std::isfinite(ceiling)) return false;
    char text[64];
    std::snprintf(text, sizeof text, "%.4g", ceiling);
    out = {NanAction::clip, d.what + "; applied with the gradient norm clipped to " + text +
                                " (the window's mean + spike_zscore standard deviations)"};
    out.clip_norm = ceiling;
    return true;
  }

 private:
  NanDetector detector_;
  int64_t max_consecutive_;
};

}  // namespace ampkit

// A spike_zscore to start from, quoted by the option's help and set where spike detection is turned
// on without a value (the seeds' NaN strategy "clip", python/src/facts.cpp).
#define AMPKIT_CAUTIOUS_SPIKE_ZSCORE 6

// Option specs of ampkit::NanDetector (nan_detector.h), for NaN policies that use it:
//   AMPKIT_PLUGIN(nan_policy, mine, MyPolicy, "...", AMPKIT_NAN_DETECTOR_OPTIONS, ...)
#define AMPKIT_NAN_DETECTOR_OPTIONS \
  ampkit::OptionSpec::Int("spike_window", "100",                                                   \
                          "Recent healthy steps whose loss and gradient norm define 'normal' for " \
                          "spike detection.")                                                      \
      .min(2)                                                                                      \
      .max(100000),                                                                                \
      ampkit::OptionSpec::Float("spike_zscore", "0",                                               \
                                "A loss or gradient norm this many standard deviations above the " \
                                "window's mean is a spike; 0 turns spike detection off ("          \
                                AMPKIT_STRINGIFY(AMPKIT_CAUTIOUS_SPIKE_ZSCORE) " is a cautious "   \
                                "starting point).")                                                \
          .min(0),                                                                                 \
      ampkit::OptionSpec::Int("spike_min_samples", "20",                                           \
                              "Healthy steps needed in the window before spikes are judged.")      \
          .min(2)

// The recovery of a finite spike, for policies that offer clipping (skip, backoff, rollback):
//   ampkit::OptionSpec::Choice("on_spike", "skip", AMPKIT_ON_SPIKE_HELP ...)
#define AMPKIT_ON_SPIKE_HELP                                                                 \
  "What to do with a finite loss or gradient-norm spike (spike_zscore > 0): skip the step, " \
  "or clip: apply it with the gradient norm clipped to the window's mean + spike_zscore "    \
  "standard deviations. Non-finite steps are never clipped."
