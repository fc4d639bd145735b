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
  std::vector<std::pair<std::string, std::string>> clipper_set;  // clipper options the user set
};
PrecisionFacts precision_facts(const TrainConfig& cfg, const StrategySet& strategies);

// Warnings (and "note: " lines) for the summary and stderr.
std::vector<std::string> precision_warnings(const PrecisionFacts& facts);

// fp16 with a constant scale of 1 or less: the fraction of gradient elements lost to underflow
// is worth measuring at step 0.
bool reports_underflow(const TrainConfig& cfg, const LossScaler& scaler);
std::string underflow_warning(double zero_fraction);

}  // namespace ampkit::train
