// A DeepSpeed config's precision, loss-scaling and clipping keys as ampkit's plugins and options.
#pragma once

#include <ampkit/step.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ampkit {

// What a DeepSpeed config (its JSON) says that ampkit has a counterpart for. DeepSpeed's meaning is
// kept, defaults included: fp16.enabled with loss_scale 0 is the `dynamic` scaler (init_scale
// 2**initial_scale_power, growth_interval = loss_scale_window, hysteresis, min_scale =
// min_loss_scale, on_min_scale from raise_error_at_min_scale), with DeepSpeed's config defaults
// (2**16, 1000, 2, 1) for keys a section leaves out, or its DynamicLossScaler's own (2**32, 1000,
// 1, 1) when the section names none; loss_scale > 0 is the `static` scaler; bf16.enabled is bf16
// with no scaler; gradient_clipping > 0 is the `norm` clipper. DeepSpeed 0.17.0's rules
// (docs/configuration.md, "Which DeepSpeed", says what 0.17.1 changed).
struct DeepSpeedMapping {
  Precision precision = Precision::fp32;
  std::map<std::string, std::string> plugins;                         // kind -> plugin name
  std::map<std::string, std::map<std::string, std::string>> options;  // kind -> option -> value text
  std::optional<int64_t> micro_batch_size;                            // train_micro_batch_size_per_gpu
  std::optional<int64_t> accumulation_steps;                          // gradient_accumulation_steps
  std::optional<int64_t> global_batch_size;                           // train_batch_size (all ranks)
  // Keys that concern precision, scaling, clipping or batching but have no counterpart (with the
  // reason where one helps), for one warning line; keys about ZeRO, optimizers, logging... are
  // not ours and are not listed.
  std::vector<std::string> unmapped;
};

// True when a config's top-level keys are DeepSpeed's (fp16, bf16, gradient_clipping,
// zero_optimization, train_micro_batch_size_per_gpu, ...).
bool is_deepspeed_config(const std::vector<std::string>& top_level_keys);

// Maps `json_text`, the config named `where` in messages. Throws Error(usage) for text that is no
// JSON object, a section that is no object, a value of the wrong type or out of DeepSpeed's range,
// a value left "auto" (resolved by launchers such as the HF Trainer; batch sizes left "auto" are
// left to ampkit-train's options or the Python loop) or fp16 and bf16 both enabled.
DeepSpeedMapping map_deepspeed_config(const std::string& json_text, const std::string& where);

}  // namespace ampkit
