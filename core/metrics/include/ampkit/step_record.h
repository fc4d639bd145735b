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

  // Every field that is set, in the metrics file's order, as f(key, value), the one list of the
  // record's layout (to_json and the Python GradScaler's last_step are written from it). Values are
  // int64_t, double, bool, std::string, std::vector<double>, nlohmann::json (located) or
  // std::vector<LayerNorm>. `host_fields` false leaves out what only a training host knows (epoch,
  // lr, samples_per_second, time).
  template <class F>
  void visit(F&& f, bool host_fields = true) const;
};

template <class F>
void StepRecord::visit(F&& f, bool host_fields) const {
  f("step", step);
  if (host_fields) f("epoch", epoch);
  f("loss", loss);
  f("scale", scale);
  f("scale_next", scale_next);
  f("grad_norm", grad_norm);
  f("grad_norm_clipped", grad_norm_clipped);
  f("grad_max_abs", grad_max_abs);
  f("zero_fraction", zero_fraction);
  f("clip_coef", clip_coef);
  f("clip_threshold", clip_threshold);
  f("clipped", clipped);
  f("found_inf", found_inf);
  f("action", std::string(to_string(action)));
  if (!reason.empty()) f("reason", reason);
  f("stepped", stepped);
  f("skipped_steps", skipped_steps);
  if (host_fields) {
    f("lr", lr);
    f("samples_per_second", samples_per_second);
    f("time", time);
  }
  if (!rank_samples_per_second.empty()) f("rank_samples_per_second", rank_samples_per_second);
  if (data_step) f("data_step", *data_step);
  if (steps_discarded) f("steps_discarded", *steps_discarded);
  if (rollbacks) f("rollbacks", *rollbacks);
  if (!located.is_null()) f("located", located);
  if (top_layers) f("top_layers", *top_layers);
}

}  // namespace ampkit
