// A DeepSpeed config's precision, loss-scaling and clipping keys as ampkit's plugins and options.
#pragma once

#include <ampkit/step.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ampkit {

// The DeepSpeed release whose rules a mapping follows (docs/configuration.md, "Which DeepSpeed").
// 0.17.1 grows the scale one clean step later at the start and after each overflow (the dynamic
// scaler's growth_delay 1, where 0.17.0 is 0), gives every fp16 section its config defaults and
// refuses fp16/bf16 keys it does not know.
enum class DeepSpeedVersion { v0_17_0, v0_17_1 };
inline constexpr DeepSpeedVersion kLatestDeepSpeed = DeepSpeedVersion::v0_17_1;

// "0.17.0", "0.17.1" or "latest"; anything else is Error(usage) naming the value and those three.
DeepSpeedVersion parse_deepspeed_version(const std::string& text);
const char* to_string(DeepSpeedVersion version);

// What a DeepSpeed config (its JSON) says that ampkit has a counterpart for. DeepSpeed's meaning is
// kept, defaults included: fp16.enabled with loss_scale 0 is the `dynamic` scaler (init_scale
// 2**initial_scale_power, growth_interval = loss_scale_window, hysteresis, min_scale =
// min_loss_scale, growth_delay from the version), with DeepSpeed's config defaults (2**16, 1000, 2,
// 1) for keys a section leaves out; 0.17.0 takes its DynamicLossScaler's own (2**32, 1000, 1, 1)
// when the section names none, and fp16.raise_error_at_min_scale as on_min_scale (0.17.1 refuses
// the key); loss_scale > 0 is the `static` scaler; bf16.enabled is bf16 with no scaler;
// gradient_clipping > 0 is the `norm` clipper.
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
  DeepSpeedVersion version = kLatestDeepSpeed;  // whose rules were applied
};

// True when a config's top-level keys are DeepSpeed's (fp16, bf16, gradient_clipping,
// zero_optimization, train_micro_batch_size_per_gpu, ...).
bool is_deepspeed_config(const std::vector<std::string>& top_level_keys);

// Maps `json_text`, the config named `where` in messages, by `version`'s rules; without one, by
// those its top-level key "ampkit_deepspeed_version" names (DeepSpeed ignores the key), else the
// latest. Throws Error(usage) for text that is no JSON object, a section that is no object, a value
// of the wrong type or out of DeepSpeed's range, a value left "auto" (resolved by launchers such as
// the HF Trainer; batch sizes left "auto" are left to ampkit-train's options or the Python loop),
// fp16 and bf16 both enabled, a key the version refuses, or a `version` the key contradicts.
DeepSpeedMapping map_deepspeed_config(const std::string& json_text, const std::string& where,
                                      std::optional<DeepSpeedVersion> version = std::nullopt);

}  // namespace ampkit
