// Precision warnings: checked once the strategies exist, printed by rank 0, kept in the summary.
#include "session/precision_checks.h"

#include <cstdio>
#include <cstdlib>

namespace ampkit::train {

PrecisionFacts precision_facts(const TrainConfig& cfg, const StrategySet& strategies) {
  PrecisionFacts f;
  f.precision = cfg.precision;
  const SelectedStrategy& scaler = strategies.selected("scaler");
  f.scaler = scaler.plugin->info().name;
  f.scaler_dynamic = strategies.scaler().is_dynamic();
  f.scale = strategies.scaler().scale();
  for (const auto& setting : scaler.options.settings)
    if (setting.name == "scale") f.scale_is_option = true;
  for (const auto& setting : strategies.selected("clipper").options.settings)
    if (setting.set && setting.origin != OptionOrigin::default_value)
      f.clipper_set.push_back({setting.name, setting.value, setting.precision_defaults});
  return f;
}

namespace {

std::string scale_text(double scale) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", scale);
  return text;
}

// A per-precision default as a float literal, "1.0" for 1: how a clipping threshold reads in docs.
std::string float_text(const std::string& value) {
  return value.find_first_of(".e") == std::string::npos ? value + ".0" : value;
}

// fp16 with a clipper option set to the value the clipper declares as its default for another
// precision: a threshold carried over from a bf16/fp32 recipe, where fp16 runs start elsewhere.
std::vector<PrecisionAdvice> carried_over_clipper_options(const PrecisionFacts& f) {
  std::vector<PrecisionAdvice> out;
  if (f.precision != Precision::fp16) return out;
  for (const auto& option : f.clipper_set) {
    std::string own;  // the clipper's fp16 default
    for (const auto& [precision, value] : option.precision_defaults)
      if (precision == to_string(Precision::fp16)) own = value;
    if (own.empty()) continue;
    const double v = std::strtod(option.value.c_str(), nullptr);
    if (v == std::strtod(own.c_str(), nullptr)) continue;
    for (const auto& [precision, value] : option.precision_defaults) {
      if (v != std::strtod(value.c_str(), nullptr)) continue;
      out.push_back({PrecisionAdvice::Level::note, "clipper." + option.name + "=" + option.value +
                                                       " is the usual " + precision +
                                                       " starting point; fp16 runs usually start at " +
                                                       float_text(own) + " (docs/gradient-clipping.md)"});
      break;
    }
  }
  return out;
}

// Why scaling does nothing for a precision other than fp16.
std::string no_underflow_reason(Precision p) {
  return p == Precision::bf16 ? "bf16 has fp32's exponent range" : "fp32 gradients do not underflow";
}

}  // namespace

std::vector<PrecisionAdvice> precision_warnings(const PrecisionFacts& f) {
  std::vector<PrecisionAdvice> out;
  auto warn = [&](const std::string& text) { out.push_back({PrecisionAdvice::Level::warning, text}); };
  const std::string precision = std::string("--precision ") + to_string(f.precision);
  const std::string scaler = "scaler '" + f.scaler + "' (scale " + scale_text(f.scale) + ")";
  if (f.precision != Precision::fp16 && f.scaler_dynamic)
    warn(precision + " with the dynamic loss scaler '" + f.scaler + "': " + no_underflow_reason(f.precision) +
         ", so scaling only costs work; use --scaler none");
  if (f.precision != Precision::fp16 && !f.scaler_dynamic && f.scale != 1.0)
    warn(precision + " with " + scaler + ": " + no_underflow_reason(f.precision) +
         ", so a constant scale only costs work (and a large one can overflow); use --scaler none");
  if (f.precision == Precision::fp16 && !f.scaler_dynamic && f.scale == 1.0)
    warn(precision + " with " + scaler + ": gradients below 6e-8 underflow to zero in fp16; " +
         (f.scale_is_option ? "raise it (--opt scaler.scale=1024) or use --scaler dynamic"
                            : "use --scaler dynamic or --scaler static"));
  if (f.precision == Precision::fp16 && !f.scaler_dynamic && f.scale < 1.0)
    warn(precision + " with " + scaler +
         ": a scale below 1 pushes gradients further into fp16's underflow (below 6e-8 they become "
         "zero); use a scale of at least 1, usually a power of two such as 1024, or --scaler dynamic");
  const std::vector<PrecisionAdvice> notes = carried_over_clipper_options(f);
  out.insert(out.end(), notes.begin(), notes.end());
  return out;
}

bool reports_underflow(const TrainConfig& cfg, const LossScaler& scaler) {
  return cfg.precision == Precision::fp16 && !scaler.is_dynamic() && scaler.scale() <= 1.0;
}

std::string underflow_warning(double zero_fraction) {
  char line[200];
  std::snprintf(
      line, sizeof line,
      "measured at step 0: %.2f%% of gradient elements are exactly zero (fp16 underflow without scaling)",
      100.0 * zero_fraction);
  return line;
}

}  // namespace ampkit::train
