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
    if (setting.set && setting.source.rfind("default", 0) != 0)
      f.clipper_set.emplace_back(setting.name, setting.value);
  return f;
}

namespace {

std::string scale_text(double scale) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", scale);
  return text;
}

// Why scaling does nothing for a precision other than fp16.
std::string no_underflow_reason(Precision p) {
  return p == Precision::bf16 ? "bf16 has fp32's exponent range" : "fp32 gradients do not underflow";
}

}  // namespace

std::vector<std::string> precision_warnings(const PrecisionFacts& f) {
  std::vector<std::string> out;
  const std::string precision = std::string("--precision ") + to_string(f.precision);
  const std::string scaler = "scaler '" + f.scaler + "' (scale " + scale_text(f.scale) + ")";
  if (f.precision != Precision::fp16 && f.scaler_dynamic)
    out.push_back(precision + " with the dynamic loss scaler '" + f.scaler + "': " +
                  no_underflow_reason(f.precision) + ", so scaling only costs work; use --scaler none");
  if (f.precision != Precision::fp16 && !f.scaler_dynamic && f.scale != 1.0)
    out.push_back(precision + " with " + scaler + ": " + no_underflow_reason(f.precision) +
                  ", so a constant scale only costs work (and a large one can overflow); use --scaler none");
  if (f.precision == Precision::fp16 && !f.scaler_dynamic && f.scale == 1.0)
    out.push_back(precision + " with " + scaler + ": gradients below 6e-8 underflow to zero in fp16; " +
                  (f.scale_is_option ? "raise it (--opt scaler.scale=1024) or use --scaler dynamic"
                                     : "use --scaler dynamic or --scaler static"));
  if (f.precision == Precision::fp16 && !f.scaler_dynamic && f.scale < 1.0)
    out.push_back(
        precision + " with " + scaler +
        ": a scale below 1 pushes gradients further into fp16's underflow (below 6e-8 they become "
        "zero); use a scale of at least 1, usually a power of two such as 1024, or --scaler dynamic");
  if (f.precision == Precision::fp16) {
    for (const auto& [name, value] : f.clipper_set) {
      if (name != "max_norm") continue;
      const double v = std::strtod(value.c_str(), nullptr);
      if (v == 5.0 || v == 10.0)
        out.push_back("note: clipper.max_norm=" + value + " is the usual " + (v == 5.0 ? "bf16" : "fp32") +
                      " starting point; fp16 runs usually start at 1.0 (docs/gradient-clipping.md)");
    }
  }
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
