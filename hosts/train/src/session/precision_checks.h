// Mismatches between precision and strategies that silently waste work or lose gradients (the
// class of mistake behind misaligned amp/fp16/mixed_precision settings): one line each.
#pragma once

#include <string>
#include <vector>

#include "ampkit/strategy_set.h"
#include "config/train_config.h"

namespace ampkit::train {

// Warnings (and "note: " lines) for the summary and stderr; needs the created strategies.
std::vector<std::string> precision_warnings(const TrainConfig& cfg, const StrategySet& strategies);

// fp16 with a constant scale of 1: the fraction of gradient elements lost to underflow is worth
// measuring at step 0.
bool reports_underflow(const TrainConfig& cfg, const LossScaler& scaler);
std::string underflow_warning(double zero_fraction);

}  // namespace ampkit::train
