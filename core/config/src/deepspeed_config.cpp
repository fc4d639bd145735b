// DeepSpeed configs (0.17.0's runtime/config.py and constants.py, 0.17.1's precision_config.py,
// both releases' fp16/loss_scaler.py) mapped onto ampkit's plugins, for ampkit-train's --config
// and ampkit.GradScaler.from_deepspeed_config.
#include "ampkit/deepspeed_config.h"

#include <ampkit/options.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ampkit/error.h"

namespace ampkit {

namespace {

using nlohmann::json;

// deepspeed/runtime/constants.py: what an fp16 section that names any dynamic key defaults to...
const std::map<std::string, double> kConfigDefaults = {
    {"initial_scale_power", 16}, {"loss_scale_window", 1000}, {"hysteresis", 2}, {"min_loss_scale", 1}};
// ...and fp16/loss_scaler.py DynamicLossScaler's own defaults when it names none.
const std::map<std::string, double> kScalerDefaults = {
    {"initial_scale_power", 32}, {"loss_scale_window", 1000}, {"hysteresis", 1}, {"min_loss_scale", 1}};
// 0.17.1's DeepSpeedFP16Config and DeepSpeedBF16Config fields: pydantic models that refuse others.
const std::set<std::string> kFp16Fields = {"enabled",
                                           "auto_cast",
                                           "loss_scale",
                                           "initial_scale_power",
                                           "loss_scale_window",
                                           "hysteresis",
                                           "consecutive_hysteresis",
                                           "min_loss_scale",
                                           "fp16_master_weights_and_grads"};
const std::set<std::string> kBf16Fields = {"enabled", "immediate_grad_update", "check_grad_overflow"};
// ampkit's own top-level key naming the release whose rules apply; DeepSpeed ignores it.
const char* const kVersionKey = "ampkit_deepspeed_version";
// DeepSpeed key -> the dynamic scaler's option.
const std::map<std::string, std::string> kDynamicOptions = {
    {"loss_scale_window", "growth_interval"}, {"hysteresis", "hysteresis"}, {"min_loss_scale", "min_scale"}};
const std::set<std::string> kDynamicKeys = {"initial_scale_power", "loss_scale_window", "hysteresis",
                                            "min_loss_scale", "consecutive_hysteresis"};
// Top-level sections about something other than precision, scaling, clipping and batch sizes.
const std::set<std::string> kUnrelated = {"optimizer",
                                          "scheduler",
                                          "zero_optimization",
                                          "zero_allow_untested_optimizer",
                                          "zero_force_ds_cpu_optimizer",
                                          "steps_per_print",
                                          "wall_clock_breakdown",
                                          "memory_breakdown",
                                          "dump_state",
                                          "flops_profiler",
                                          "tensorboard",
                                          "wandb",
                                          "csv_monitor",
                                          "comet",
                                          "comms_logger",
                                          "activation_checkpointing",
                                          "aio",
                                          "checkpoint",
                                          "data_efficiency",
                                          "curriculum_learning",
                                          "autotuning",
                                          "elasticity",
                                          "pipeline",
                                          "sparse_attention",
                                          "compression_training",
                                          "nebula",
                                          "weight_quantization",
                                          "hybrid_engine",
                                          "timers",
                                          "sequence_parallel_size",
                                          "disable_allgather",
                                          "sparse_gradients",
                                          "seed",
                                          "eigenvalue",
                                          "progressive_layer_drop",
                                          "quantize_training"};
// Batch sizes: "auto" leaves them to the launcher (ampkit-train's --batch-size and --accumulate, or
// the Python loop), as the HF Trainer resolves them from its own arguments.
const std::set<std::string> kBatchKeys = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                          "train_batch_size"};
const std::set<std::string> kMappedTop = {"fp16",
                                          "bf16",
                                          "bfloat16",
                                          "gradient_clipping",
                                          "train_micro_batch_size_per_gpu",
                                          "gradient_accumulation_steps",
                                          "train_batch_size"};

double number(const json& v, const std::string& key, const std::string& where) {
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where + ": " + key + " must be a number, got " + v.dump());
  return v.get<double>();
}

double positive(const json& v, const std::string& key, const std::string& where) {
  const double d = number(v, key, where);
  if (!(d > 0) || d > std::numeric_limits<float>::max())
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where + ": " + key + " must be > 0 (a float32), got " + v.dump());
  return d;
}

int64_t count(const json& v, const std::string& key, const std::string& where) {
  const double d = number(v, key, where);
  if (d < 1 || d != std::floor(d) || d > 1e15)
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + ": " + key +
                                          " must be a whole number in [1, 1e15], got " + v.dump());
  return static_cast<int64_t>(d);
}

void refuse_auto(const json& section, const std::string& prefix, const std::string& where) {
  for (const auto& [key, value] : section.items())
    if (value == "auto" && !(prefix.empty() && kBatchKeys.count(key)))
      throw Error(ErrorCategory::usage, "DeepSpeed config " + where + ": " + prefix + key +
                                            " is \"auto\": resolve it to a value first, as the HF Trainer "
                                            "does from its own arguments");
}

// A section that is there must be an object, as DeepSpeed's config classes require.
const json& section(const json& ds, const std::string& name, const std::string& where) {
  static const json empty = json::object();
  if (!ds.contains(name)) return empty;
  if (!ds[name].is_object())
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where + ": " + name + " must be an object, got " + ds[name].dump());
  return ds[name];
}

// initial_scale_power: DeepSpeed's int field; 2**power must be a positive normal float32.
int power(const json& v, const std::string& where) {
  const double d = number(v, "fp16.initial_scale_power", where);
  if (d != std::floor(d) || d < -126 || d > 127)
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where +
                    ": fp16.initial_scale_power must be a whole number in [-126, 127], got " + v.dump());
  return static_cast<int>(d);
}

bool enabled(const json& section, const std::string& name, const std::string& where) {
  if (!section.contains("enabled")) return false;
  if (!section["enabled"].is_boolean())
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + ": " + name +
                                          ".enabled must be true or false, got " + section["enabled"].dump());
  return section["enabled"].get<bool>();
}

// An enabled fp16 section: the scaler and its options.
void map_fp16(const json& fp16, const std::string& where, DeepSpeedMapping& m) {
  const bool v0_17_0 = m.version == DeepSpeedVersion::v0_17_0;
  auto& opt = m.options["scaler"];
  const double loss_scale =
      fp16.contains("loss_scale") ? number(fp16["loss_scale"], "fp16.loss_scale", where) : 0;
  if (loss_scale < 0 || loss_scale > std::numeric_limits<float>::max())
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where +
                    ": fp16.loss_scale must be in [0, 3.4e+38] (0: dynamic loss scaling), got " +
                    fp16["loss_scale"].dump());
  if (loss_scale > 0) {
    m.plugins["scaler"] = "static";
    opt["scale"] = format_number(loss_scale);
    for (const auto& [key, value] : fp16.items())
      if (kDynamicKeys.count(key) || key == "raise_error_at_min_scale")
        m.unmapped.push_back("fp16." + key + " (unused with a static loss_scale)");
    return;
  }
  m.plugins["scaler"] = "dynamic";
  bool named = false;
  for (const auto& key : kDynamicKeys) named = named || fp16.contains(key);
  // 0.17.0 built its DynamicLossScaler from the constructor's defaults when no key was named;
  // 0.17.1's config model always passes its field defaults.
  std::map<std::string, double> values = named || !v0_17_0 ? kConfigDefaults : kScalerDefaults;
  for (auto& [key, value] : values) {
    if (!fp16.contains(key)) continue;
    if (key == "initial_scale_power")
      value = power(fp16[key], where);
    else if (key == "min_loss_scale" && v0_17_0)
      value = positive(fp16[key], "fp16." + key, where);
    else  // loss_scale_window, hysteresis (and 0.17.1's min_loss_scale): DeepSpeed's int fields
      value = static_cast<double>(count(fp16[key], "fp16." + key, where));
  }
  double init = std::ldexp(1.0, static_cast<int>(values["initial_scale_power"]));
  if (init < values["min_loss_scale"]) {  // DeepSpeed starts there, and its first backoff raises it
    m.unmapped.push_back(
        "fp16.initial_scale_power (2**power = " + format_number(init) + " is below min_loss_scale " +
        format_number(values["min_loss_scale"]) +
        ": ampkit starts at min_loss_scale, where DeepSpeed rises to it at the first overflow)");
    init = values["min_loss_scale"];
  }
  opt["init_scale"] = format_number(init);
  for (const auto& [key, option] : kDynamicOptions) opt[option] = format_number(values[key]);
  // 0.17.1 counts `iterations since the last overflow - 1`: one clean step more before each first
  // growth (tests/data/deepspeed_scaler_goldens.json, from both releases' own update_scale).
  opt["growth_delay"] = v0_17_0 ? "0" : "1";
  if (fp16.contains("consecutive_hysteresis") && fp16["consecutive_hysteresis"] == true)
    m.unmapped.push_back(
        "fp16.consecutive_hysteresis (true: ampkit's dynamic scaler refills its hysteresis only at a "
        "growth, as DeepSpeed does with false)");
  if (fp16.contains("raise_error_at_min_scale")) {
    if (!fp16["raise_error_at_min_scale"].is_boolean())
      throw Error(ErrorCategory::usage,
                  "DeepSpeed config " + where + ": fp16.raise_error_at_min_scale must be true or false");
    opt["on_min_scale"] = fp16["raise_error_at_min_scale"].get<bool>() ? "error" : "clamp";
  }
}

// 0.17.1's config models refuse a key they do not declare, enabled or not (pydantic's "forbid").
void refuse_unknown(const json& section, const std::set<std::string>& fields, const std::string& name,
                    const std::string& where) {
  for (const auto& [key, value] : section.items()) {
    if (fields.count(key)) continue;
    std::string known;
    for (const auto& f : fields) known += (known.empty() ? "" : ", ") + f;
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where + ": " + name + "." + key + " is no key of DeepSpeed 0.17.1's " +
                    name + " section, which refuses it (it takes " + known + ")" +
                    (key == "raise_error_at_min_scale"
                         ? "; set the scaler's on_min_scale instead, or map by DeepSpeed 0.17.0's rules"
                         : ""));
  }
}

// The release a config is mapped by: the one asked for, which the config's own key must not
// contradict, else that key's, else the latest.
DeepSpeedVersion version_of(const json& ds, const std::string& where, std::optional<DeepSpeedVersion> asked) {
  if (!ds.contains(kVersionKey)) return asked.value_or(kLatestDeepSpeed);
  const json& v = ds[kVersionKey];
  if (!v.is_string())
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + ": " + kVersionKey +
                                          " must be a text such as \"0.17.1\", got " + v.dump());
  const DeepSpeedVersion named = parse_deepspeed_version(v.get<std::string>());
  if (asked && *asked != named)
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + " names " + kVersionKey + " " +
                                          to_string(named) + ", but DeepSpeed " + to_string(*asked) +
                                          "'s rules were asked for: give one");
  return named;
}

// JSON leaves a key given twice in one object open and nlohmann keeps the last; DeepSpeed refuses
// such a config (its json.load's object_pairs_hook), and so do we, naming the key with its path.
json parse_refusing_duplicates(const std::string& text, const std::string& where) {
  struct Open {
    std::set<std::string> keys;
    std::string last;  // the key whose value is being read
  };
  std::vector<Open> objects;
  return json::parse(text, [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      objects.pop_back();
    } else if (event == json::parse_event_t::key && !objects.empty()) {
      Open& o = objects.back();
      o.last = parsed.get<std::string>();
      if (!o.keys.insert(o.last).second) {
        std::string path;
        for (const Open& outer : objects) path += (path.empty() ? "" : ".") + outer.last;
        throw Error(ErrorCategory::usage, "DeepSpeed config " + where + " gives key '" + path +
                                              "' twice: give each key once (DeepSpeed refuses it too)");
      }
    }
    return true;
  });
}

}  // namespace

DeepSpeedVersion parse_deepspeed_version(const std::string& text) {
  if (text == "0.17.0") return DeepSpeedVersion::v0_17_0;
  if (text == "0.17.1" || text == "latest") return DeepSpeedVersion::v0_17_1;
  throw Error(ErrorCategory::usage,
              "DeepSpeed version '" + text + "' is not one ampkit maps: give 0.17.0, 0.17.1 or latest");
}

const char* to_string(DeepSpeedVersion version) {
  return version == DeepSpeedVersion::v0_17_0 ? "0.17.0" : "0.17.1";
}

bool is_deepspeed_config(const std::vector<std::string>& keys) {
  return std::any_of(keys.begin(), keys.end(),
                     [](const std::string& k) { return kMappedTop.count(k) != 0; }) ||
         std::any_of(keys.begin(), keys.end(), [](const std::string& k) { return k == "zero_optimization"; });
}

DeepSpeedMapping map_deepspeed_config(const std::string& json_text, const std::string& where,
                                      std::optional<DeepSpeedVersion> version) {
  json ds;
  try {
    ds = parse_refusing_duplicates(json_text, where);
  } catch (const json::exception& e) {
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + " is not valid JSON: " + e.what());
  }
  if (!ds.is_object())
    throw Error(ErrorCategory::usage, "DeepSpeed config " + where + " must be a JSON object");
  const std::string bf16_name = ds.contains("bf16") ? "bf16" : "bfloat16";
  const json& fp16 = section(ds, "fp16", where);
  const json& bf16 = section(ds, bf16_name, where);
  refuse_auto(ds, "", where);
  refuse_auto(fp16, "fp16.", where);
  refuse_auto(bf16, bf16_name + ".", where);
  DeepSpeedMapping m;
  m.version = version_of(ds, where, version);
  if (m.version != DeepSpeedVersion::v0_17_0) {
    refuse_unknown(fp16, kFp16Fields, "fp16", where);
    refuse_unknown(bf16, kBf16Fields, bf16_name, where);
  }
  const bool fp16_on = enabled(fp16, "fp16", where), bf16_on = enabled(bf16, bf16_name, where);
  if (fp16_on && bf16_on)
    throw Error(ErrorCategory::usage,
                "DeepSpeed config " + where + " enables both fp16 and bf16: enable one");
  m.plugins["scaler"] = "none";
  m.plugins["clipper"] = "none";
  static const std::set<std::string> mapped_fp16 = {
      "enabled",           "loss_scale", "raise_error_at_min_scale", "initial_scale_power",
      "loss_scale_window", "hysteresis", "min_loss_scale",           "consecutive_hysteresis"};
  if (fp16_on) {
    m.precision = Precision::fp16;
    map_fp16(fp16, where, m);
    for (const auto& [key, value] : fp16.items())
      if (!mapped_fp16.count(key)) m.unmapped.push_back("fp16." + key);
  } else if (bf16_on) {
    m.precision = Precision::bf16;
    for (const auto& [key, value] : bf16.items())
      if (key != "enabled") m.unmapped.push_back(bf16_name + "." + key);
  }
  const double clipping =
      ds.contains("gradient_clipping") ? number(ds["gradient_clipping"], "gradient_clipping", where) : 0;
  if (clipping > 0) {
    m.plugins["clipper"] = "norm";
    m.options["clipper"]["max_norm"] = format_number(clipping);
  }
  const auto given = [&](const char* key) { return ds.contains(key) && ds[key] != "auto"; };
  if (given("train_micro_batch_size_per_gpu"))
    m.micro_batch_size = count(ds["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu", where);
  if (given("gradient_accumulation_steps"))
    m.accumulation_steps = count(ds["gradient_accumulation_steps"], "gradient_accumulation_steps", where);
  if (given("train_batch_size"))
    m.global_batch_size = count(ds["train_batch_size"], "train_batch_size", where);
  for (const auto& [key, value] : ds.items())
    if (!kMappedTop.count(key) && !kUnrelated.count(key) && key != kVersionKey) m.unmapped.push_back(key);
  return m;
}

}  // namespace ampkit
