// Precision warnings: checked once the strategies exist, printed by rank 0, kept in the summary.
#include "session/precision_checks.h"

#include <cstdio>
#include <cstdlib>

namespace ampkit::train {

std::vector<std::string> precision_warnings(const TrainConfig& cfg, const StrategySet& strategies) {
  std::vector<std::string> out;
  const std::string precision = to_string(cfg.precision);
  const LossScaler& scaler = strategies.scaler();
  const std::string scaler_name = strategies.selected("scaler").plugin->info().name;
  if (cfg.precision != Precision::fp16 && scaler.is_dynamic())
    out.push_back("--precision " + precision + " with the dynamic loss scaler '" + scaler_name + "': " +
                  precision + " has fp32's exponent range, so scaling only costs work; use --scaler none");
  if (cfg.precision == Precision::fp16 && !scaler.is_dynamic() && scaler.scale() == 1.0)
    out.push_back("--precision fp16 with scaler '" + scaler_name +
                  "' (scale 1): gradients below 6e-8 underflow to zero in fp16; use a dynamic scaler or "
                  "--scaler static");
  if (cfg.precision == Precision::fp16) {
    for (const auto& setting : strategies.selected("clipper").options.settings) {
      if (setting.name != "max_norm" || !setting.set || setting.source.rfind("default", 0) == 0) continue;
      const double v = std::strtod(setting.value.c_str(), nullptr);
      if (v == 5.0 || v == 10.0)
        out.push_back("note: clipper.max_norm=" + setting.value + " is the usual " +
                      (v == 5.0 ? "bf16" : "fp32") +
                      " starting point; fp16 runs usually start at 1.0 (docs/gradient-clipping.md)");
    }
  }
  return out;
}

bool reports_underflow(const TrainConfig& cfg, const LossScaler& scaler) {
  return cfg.precision == Precision::fp16 && !scaler.is_dynamic() && scaler.scale() == 1.0;
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
