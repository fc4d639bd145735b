// The manifest's JSON: checkpoint metadata, strategies' State, and the CPU RNG state.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include "ampkit/error.h"
#include "ampkit/utf8.h"
#include "checkpoint_files.h"

namespace ampkit {

using checkpoint_files::fail;

namespace {

std::string hex_encode(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string hex_decode(const std::string& hex) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2) fail("RNG state in the manifest is not hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) fail("RNG state in the manifest is not hex");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace

namespace checkpoint_files {

nlohmann::json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::json j;
  j["format"] = "ampkit-checkpoint";
  j["format_version"] = m.format_version;
  j["ampkit_version"] = m.ampkit_version;
  j["torch_version"] = m.torch_version;
  j["step"] = {{"attempted", m.steps_attempted},
               {"taken", m.steps_taken},
               {"consecutive_skips", m.consecutive_skips},
               {"epoch", m.epoch},
               {"data_position", m.steps_attempted}};
  j["config"] = nlohmann::json::array();
  for (const auto& [name, setting] : m.config)
    j["config"].push_back({{"name", name}, {"value", setting.value}, {"source", setting.source}});
  j["plugins"] = nlohmann::json::array();
  for (const auto& p : m.plugins) {
    nlohmann::json state;
    try {
      state = state_to_json(p.state);
    } catch (const Error& e) {
      throw Error(e.category(), p.kind + " '" + p.name + "': " + e.what());
    }
    j["plugins"].push_back({{"kind", p.kind}, {"name", p.name}, {"version", p.version}, {"state", state}});
  }
  j["rng"] = {{"cpu", hex_encode(m.cpu_rng_state)}};
  j["param_sha256"] = m.param_sha256;
  j["host"] = m.host;
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : m.tensors)
    j["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
  return j;
}

CheckpointManifest manifest_from_json(const nlohmann::json& j) {
  CheckpointManifest m;
  m.format_version = j.at("format_version").get<int>();
  m.ampkit_version = j.at("ampkit_version").get<std::string>();
  m.torch_version = j.at("torch_version").get<std::string>();
  const auto& step = j.at("step");
  m.steps_attempted = step.at("attempted").get<int64_t>();
  m.steps_taken = step.at("taken").get<int64_t>();
  m.consecutive_skips = step.at("consecutive_skips").get<int64_t>();
  m.epoch = step.at("epoch").get<int64_t>();
  for (const auto& s : j.at("config"))
    m.config[s.at("name").get<std::string>()] = {s.at("value").get<std::string>(),
                                                 s.at("source").get<std::string>()};
  for (const auto& p : j.at("plugins"))
    m.plugins.push_back({p.at("kind").get<std::string>(), p.at("name").get<std::string>(),
                         p.at("version").get<std::string>(), state_from_json(p.at("state"))});
  m.cpu_rng_state = hex_decode(j.at("rng").at("cpu").get<std::string>());
  m.param_sha256 = j.at("param_sha256").get<std::string>();
  m.host = j.at("host");
  for (const auto& t : j.at("tensors"))
    m.tensors.push_back({t.at("name").get<std::string>(), t.at("dtype").get<std::string>(),
                         t.at("shape").get<std::vector<int64_t>>()});
  return m;
}

}  // namespace checkpoint_files

nlohmann::json state_to_json(const State& state) {
  nlohmann::json out = nlohmann::json::object();
  auto f64 = [](double v) -> nlohmann::json {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return v;
  };
  for (const auto& [key, value] : state.values()) {
    const auto* text = std::get_if<std::string>(&value);
    if (invalid_utf8_at(key) || (text != nullptr && invalid_utf8_at(*text)))
      throw Error(ErrorCategory::plugin, "its saved State has a key or string that is not UTF-8 (key '" +
                                             key + "'); a checkpoint manifest holds only UTF-8 text");
    nlohmann::json entry;
    if (const auto* b = std::get_if<bool>(&value))
      entry = {{"type", "bool"}, {"value", *b}};
    else if (const auto* i = std::get_if<int64_t>(&value))
      entry = {{"type", "i64"}, {"value", *i}};
    else if (const auto* d = std::get_if<double>(&value))
      entry = {{"type", "f64"}, {"value", f64(*d)}};
    else if (const auto* s = std::get_if<std::string>(&value))
      entry = {{"type", "str"}, {"value", *s}};
    else {
      nlohmann::json list = nlohmann::json::array();
      for (double v : std::get<std::vector<double>>(value)) list.push_back(f64(v));
      entry = {{"type", "f64[]"}, {"value", list}};
    }
    out[key] = entry;
  }
  return out;
}

State state_from_json(const nlohmann::json& json) {
  auto f64 = [](const nlohmann::json& v) -> double {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::nan("");
      if (s == "inf") return HUGE_VAL;
      if (s == "-inf") return -HUGE_VAL;
      fail("plugin state holds '" + s + "' where a number belongs");
    }
    return v.get<double>();
  };
  State state;
  for (const auto& [key, entry] : json.items()) {
    const std::string type = entry.at("type").get<std::string>();
    const auto& v = entry.at("value");
    if (type == "bool")
      state.set(key, v.get<bool>());
    else if (type == "i64")
      state.set(key, v.get<int64_t>());
    else if (type == "f64")
      state.set(key, f64(v));
    else if (type == "str")
      state.set(key, v.get<std::string>());
    else if (type == "f64[]") {
      std::vector<double> list;
      for (const auto& x : v) list.push_back(f64(x));
      state.set(key, std::move(list));
    } else {
      fail("plugin state key '" + key + "' has unknown type '" + type + "'");
    }
  }
  return state;
}

std::string cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor s = gen.get_state().contiguous();
  return std::string(static_cast<const char*>(s.data_ptr()), static_cast<size_t>(s.nbytes()));
}

void set_cpu_rng_state(const std::string& bytes) {
  at::Tensor s = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(s.data_ptr(), bytes.data(), bytes.size());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(s);
  } catch (const c10::Error& e) {
    fail(std::string("the checkpoint's CPU RNG state does not fit this LibTorch: ") +
         e.what_without_backtrace());
  }
}

}  // namespace ampkit
