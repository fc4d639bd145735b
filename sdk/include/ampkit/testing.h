// Unit-testing a plugin without a host: link the plugin's object files into a test program, take
// its descriptor from the entry AMPKIT_PLUGIN exported, and build the strategy as ampkit-train
// would (declared defaults, the run precision's for per-precision options, then your overrides,
// each checked against the option's type, range and choices), then feed it StepStats:
//
//   AMPKIT_TESTING_DECLARE(clipper, ema_norm);   // at file scope
//   const auto& d = AMPKIT_TESTING_DESCRIPTOR(clipper, ema_norm);
//   auto clipper = ampkit::testing::make<ampkit::GradClipper>(d, {{"factor", "3"}}, ampkit::Precision::bf16);
//   ampkit::ClipResult r = clipper->clip(ampkit::testing::step(0, /*grad_norm=*/2.0));
//
// Header-only; link the test with ampkit::sdk (and ampkit::torch_cpu for tensor kinds).
// docs/plugin-authoring.md (section 9, "Unit-testing a plugin without the host") walks through it.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/step.h>
#include <ampkit/strategy.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#define AMPKIT_TESTING_DECLARE(kind, name) extern "C" const void* AMPKIT_PLUGIN_ENTRY_NAME(kind, name)
#define AMPKIT_TESTING_DESCRIPTOR(kind, name) \
  ::ampkit::testing::descriptor_of(AMPKIT_PLUGIN_ENTRY_NAME(kind, name))

namespace ampkit::testing {

// The descriptor behind a plugin's exported entry alias.
inline const ampkit_plugin_descriptor& descriptor_of(const void* entry) {
  if (entry == nullptr) throw std::logic_error("ampkit::testing: the plugin entry is null");
  const auto fn = reinterpret_cast<ampkit_entry_fn>(reinterpret_cast<std::intptr_t>(entry));
  return *fn();
}

namespace detail {

inline std::invalid_argument bad_value(const ampkit_option_spec& spec, const std::string& text,
                                       const std::string& why) {
  return std::invalid_argument("option '" + std::string(spec.name) + "' " + why + ", got '" + text + "'");
}

// The value's canonical text, as the host hands it to the plugin; throws naming the option.
inline std::string checked(const ampkit_option_spec& s, const std::string& text) {
  switch (s.type) {
    case AMPKIT_OPTION_BOOL:
      if (const std::optional<bool> b = parse_bool_text(text)) return *b ? "true" : "false";
      throw bad_value(s, text, "must be true or false");
    case AMPKIT_OPTION_STRING:
      return text;
    case AMPKIT_OPTION_CHOICE:
      if (("|" + std::string(s.choices ? s.choices : "") + "|").find("|" + text + "|") != std::string::npos)
        return text;
      throw bad_value(s, text, "must be one of " + std::string(s.choices ? s.choices : ""));
    default: {
      const bool integer = s.type == AMPKIT_OPTION_INT;
      char* end = nullptr;
      errno = 0;
      const long long i = integer ? std::strtoll(text.c_str(), &end, 10) : 0;
      const double v = integer ? static_cast<double>(i) : std::strtod(text.c_str(), &end);
      if (text.empty() || text[0] == '+' || text[0] == ' ' || *end != '\0' || errno == ERANGE ||
          !std::isfinite(v))
        throw bad_value(s, text, integer ? "must be an integer" : "must be a finite number");
      if (!declared_range(s).contains(v)) throw bad_value(s, text, "is out of its declared range");
      return integer ? std::to_string(i) : format_number(v);
    }
  }
}

// The declared default for `precision` ("fp16=1;bf16=5;fp32=10" for per-precision options), or
// nothing (the option stays unset unless given).
inline bool default_for(const ampkit_option_spec& s, Precision precision, std::string& out) {
  if (s.default_value == nullptr) return false;
  if (!(s.flags & AMPKIT_OPTION_PER_PRECISION)) {
    out = s.default_value;
    return true;
  }
  const std::string list = std::string(";") + s.default_value + ";";
  const std::string key = std::string(";") + to_string(precision) + "=";
  const size_t at = list.find(key);
  if (at == std::string::npos) return false;
  const size_t start = at + key.size();
  out = list.substr(start, list.find(';', start) - start);
  return true;
}

}  // namespace detail

// The option values the host would pass for `overrides` at `precision`. Throws
// std::invalid_argument for an unknown option or a bad value.
inline OptionValues resolve(const ampkit_plugin_descriptor& d,
                            const std::map<std::string, std::string>& overrides = {},
                            Precision precision = Precision::fp32) {
  OptionValues values;
  std::map<std::string, std::string> left = overrides;
  for (uint32_t i = 0; i < d.option_count; ++i) {
    const ampkit_option_spec& s = d.options[i];
    std::string text;
    const auto given = left.find(s.name);
    if (given != left.end()) {
      text = given->second;
      left.erase(given);
    } else if (!detail::default_for(s, precision, text)) {
      continue;
    }
    values.set(s.name, detail::checked(s, text));
  }
  if (!left.empty())
    throw std::invalid_argument(std::string(d.kind) + " '" + d.name + "' has no option '" +
                                left.begin()->first + "'");
  return values;
}

// Creates the strategy from resolved options as the host does, checks that it implements
// `Interface`, and calls start(run) (run.precision picks per-precision defaults).
template <class Interface>
std::unique_ptr<Interface> make(const ampkit_plugin_descriptor& d,
                                const std::map<std::string, std::string>& overrides = {},
                                const RunInfo& run = RunInfo{}) {
  const OptionValues values = resolve(d, overrides, run.precision);
  char error[512] = {};
  void* object = d.create(&values, error, sizeof error);
  if (object == nullptr)
    throw std::invalid_argument(std::string(d.kind) + " '" + d.name + "' refused its options: " + error);
  std::unique_ptr<Strategy> strategy(static_cast<Strategy*>(object));
  auto* typed = dynamic_cast<Interface*>(strategy.get());
  if (typed == nullptr)
    throw std::logic_error(std::string(d.kind) + " '" + d.name +
                           "' does not implement the requested interface");
  strategy.release();
  std::unique_ptr<Interface> out(typed);
  out->start(run);
  return out;
}

// A check for tests without a framework: a failed condition prints FILE:LINE and itself and is
// counted; finish("test_x") prints "test_x: ok" or "test_x: FAILED" and returns the exit status.
inline int& failures() {
  static int count = 0;
  return count;
}
inline int finish(const char* test) {
  std::printf("%s: %s\n", test, failures() == 0 ? "ok" : "FAILED");
  return failures() == 0 ? 0 : 1;
}
#define AMPKIT_CHECK(condition)                                                          \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition); \
      ++::ampkit::testing::failures();                                                   \
    }                                                                                    \
  } while (0)

// A healthy step's statistics: unscaled gradient norm and max |g|, the loss scale used.
inline StepStats step(int64_t index, double grad_norm, double loss = 1.0, double scale = 1.0) {
  StepStats s;
  s.step = index;
  s.loss = loss;
  s.scale = scale;
  s.grad_norm = grad_norm;
  s.grad_norm_scaled = grad_norm * scale;
  s.grad_max_abs = grad_norm;
  s.grad_max_abs_scaled = grad_norm * scale;
  s.grad_elements = 1;
  return s;
}

// A step whose gradients overflowed (inf) at `scale`.
inline StepStats overflow(int64_t index, double scale = 65536.0) {
  StepStats s = step(index, INFINITY, 1.0, scale);
  s.found_inf = true;
  return s;
}

}  // namespace ampkit::testing
