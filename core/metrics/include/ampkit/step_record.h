// One optimizer step as the metrics see it: plain values, filled by whoever ran the step (the
// engine's StepOutcome becomes one in ampkit/outcome_record.h), read by the JSONL writer,
// TensorBoard and the progress line.
#pragma once

#include <ampkit/step.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ampkit {

// One parameter's gradient norm, by name (top_layers' entries).
struct LayerNorm {
  std::string name;
  double grad_norm = 0;
};

// The record of one step (keys documented in docs/configuration.md). Non-finite numbers are
// kept as they are; only to_json spells them as strings, since JSON has no inf or NaN.
struct StepRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;
  double scale = 1;
  double scale_next = 1;
  double grad_norm = 0;
  double grad_norm_clipped = 0;
  double grad_max_abs = 0;
  double zero_fraction = 0;
  double clip_coef = 1;
  double clip_threshold = 0;  // the clipper's threshold this step; 0: none
  bool clipped = false;       // stepped with a clip coefficient below 1
  bool found_inf = false;
  NanAction action = NanAction::proceed;
  std::string reason;  // the NaN policy's, written when not empty
  bool stepped = false;
  int64_t skipped_steps = 0;  // skipped so far, this step included
  double lr = 0;
  double samples_per_second = 0;
  double time = 0;  // seconds since training started
  // What a host adds when it has it; written only when set.
  std::vector<double> rank_samples_per_second;  // multi-process runs: each rank's
  std::optional<int64_t> data_step;             // the step of the data this step trained on
  std::optional<int64_t> steps_discarded;
  std::optional<int64_t> rollbacks;
  nlohmann::json located;                            // the NaN locator's finding; null: none
  std::optional<std::vector<LayerNorm>> top_layers;  // largest gradient norms first

  // One JSON object (a line of the metrics file).
  nlohmann::json to_json() const;
};

}  // namespace ampkit
