// Mismatches between precision and strategies that silently waste work or lose gradients (the
// class of mistake behind misaligned amp/fp16/mixed_precision settings): one line each.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ampkit/strategy_set.h"
#include "config/train_config.h"

namespace ampkit::train {

// What the checks look at, read from the created strategies (precision_facts) or written by a test.
struct PrecisionFacts {
  Precision precision = Precision::fp32;
  std::string scaler;            // the loss scaler's plugin name
  bool scaler_dynamic = false;   // LossScaler::is_dynamic()
  double scale = 1.0;            // its scale at the start
  bool scale_is_option = false;  // the scaler has a `scale` option (static) the user can raise
  // A clipper option the user set (not its default), with the per-precision defaults the clipper
  // declares for it (empty when it has one default for every precision).
  struct ClipperOption {
    std::string name, value;
    std::vector<std::pair<std::string, std::string>> precision_defaults;  // "fp16" -> "1", ...
  };
  std::vector<ClipperOption> clipper_set;
};
PrecisionFacts precision_facts(const TrainConfig& cfg, const StrategySet& strategies);

// One line of advice: a warning (the run wastes work or loses gradients) or a note (a setting
// that is usual for another precision).
struct PrecisionAdvice {
  enum class Level { warning, note };
  Level level = Level::warning;
  std::string text;
  // As the summary's warnings keep it: a note starts with "note: ".
  std::string summary_line() const { return level == Level::note ? "note: " + text : text; }
};
std::vector<PrecisionAdvice> precision_warnings(const PrecisionFacts& facts);

// fp16 with a constant scale of 1 or less: the fraction of gradient elements lost to underflow
// is worth measuring at step 0.
bool reports_underflow(const TrainConfig& cfg, const LossScaler& scaler);
std::string underflow_warning(double zero_fraction);

}  // namespace ampkit::train
