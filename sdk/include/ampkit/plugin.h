// The C ABI between the ampkit host and a plugin library: one descriptor, one entry, one macro.
//
// A plugin library exports exactly one entry, `ampkit_v<ABI>_<kind>_<name>`, placed with
// BOOST_DLL_ALIAS_SECTIONED in the ELF section "ampkit", and a text record in the section
// "ampkitmd" (abi, kind, name, version, summary, torch version, compiler). The host reads both
// from the file without running plugin code, checks the ABI and torch versions and the kind,
// and only then loads the library and calls the entry.
#pragma once

#include <ampkit/options.h>
#include <ampkit/version.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {

// Option value types. The text form of every value (defaults, command line, YAML) is parsed by
// the host; a plugin reads typed values from ampkit::OptionValues.
enum ampkit_option_type : int32_t {
  AMPKIT_OPTION_BOOL = 0,
  AMPKIT_OPTION_INT = 1,
  AMPKIT_OPTION_FLOAT = 2,
  AMPKIT_OPTION_STRING = 3,
  AMPKIT_OPTION_CHOICE = 4,
};

enum ampkit_option_flags : uint32_t {
  AMPKIT_OPTION_HAS_MIN = 1u << 0,
  AMPKIT_OPTION_HAS_MAX = 1u << 1,
  AMPKIT_OPTION_MIN_EXCLUSIVE = 1u << 2,
  AMPKIT_OPTION_MAX_EXCLUSIVE = 1u << 3,
  // default_value is one default per run precision, "fp16=1;bf16=5;fp32=10": `;`-separated
  // PRECISION=VALUE pairs, PRECISION one of fp32|bf16|fp16, each at most once. The host picks the
  // run's pair (source "default for fp16"); a precision not listed leaves the option unset.
  // Every pair is validated against the type and range when options are resolved.
  AMPKIT_OPTION_PER_PRECISION = 1u << 4,
};

struct ampkit_option_spec {
  const char* name;           // lower_snake_case, unique within the plugin
  int32_t type;               // ampkit_option_type
  uint32_t flags;             // ampkit_option_flags
  const char* default_value;  // text form; NULL: unset unless given (the plugin derives a value);
                              // with AMPKIT_OPTION_PER_PRECISION: "fp16=1;bf16=5;fp32=10"
  double min_value;           // with AMPKIT_OPTION_HAS_MIN
  double max_value;           // with AMPKIT_OPTION_HAS_MAX
  const char* choices;        // AMPKIT_OPTION_CHOICE: "a|b|c"
  const char* help;           // one sentence, shown by ampkit-plugins show and --help
};

struct ampkit_plugin_descriptor {
  uint32_t abi_version;  // AMPKIT_ABI_VERSION; first, so any host can read it
  uint32_t struct_size;  // sizeof(ampkit_plugin_descriptor) as the plugin saw it
  const char* kind;      // "scaler" | "clipper" | "nan_policy" | "comm"
  const char* name;
  const char* version;
  const char* summary;
  const char* torch_version;
  const char* compiler;
  int32_t cxx11_abi;
  uint32_t option_count;
  const ampkit_option_spec* options;
  // Creates the strategy from validated option values (an ampkit::OptionValues*). Returns an
  // ampkit::Strategy* of the descriptor's kind, or NULL with a message in `error`. Never throws.
  void* (*create)(const void* option_values, char* error, size_t error_size);
};

typedef const ampkit_plugin_descriptor* (*ampkit_entry_fn)(void);

}  // extern "C"

namespace ampkit {

// Builds an ampkit_option_spec in one expression, next to the code that reads the option:
//   ampkit::OptionSpec::Float("growth_factor", "2.0", "Factor the scale grows by.").min(1.0, true)
// A default that depends on the run's precision:
//   ampkit::OptionSpec::Float("max_norm", "fp16=1;bf16=5;fp32=10", "...").per_precision()
struct OptionSpec : ampkit_option_spec {
  constexpr OptionSpec(const char* name, int32_t type, const char* default_value, const char* help)
      : ampkit_option_spec{name, type, 0u, default_value, 0.0, 0.0, nullptr, help} {}
  static constexpr OptionSpec Bool(const char* name, const char* def, const char* help) {
    return OptionSpec(name, AMPKIT_OPTION_BOOL, def, help);
  }
  static constexpr OptionSpec Int(const char* name, const char* def, const char* help) {
    return OptionSpec(name, AMPKIT_OPTION_INT, def, help);
  }
  static constexpr OptionSpec Float(const char* name, const char* def, const char* help) {
    return OptionSpec(name, AMPKIT_OPTION_FLOAT, def, help);
  }
  static constexpr OptionSpec String(const char* name, const char* def, const char* help) {
    return OptionSpec(name, AMPKIT_OPTION_STRING, def, help);
  }
  static constexpr OptionSpec Choice(const char* name, const char* def, const char* choices,
                                     const char* help) {
    OptionSpec s(name, AMPKIT_OPTION_CHOICE, def, help);
    s.choices = choices;
    return s;
  }
  constexpr OptionSpec min(double v, bool exclusive = false) const {
    OptionSpec s = *this;
    s.flags |= AMPKIT_OPTION_HAS_MIN | (exclusive ? AMPKIT_OPTION_MIN_EXCLUSIVE : 0u);
    s.min_value = v;
    return s;
  }
  constexpr OptionSpec max(double v, bool exclusive = false) const {
    OptionSpec s = *this;
    s.flags |= AMPKIT_OPTION_HAS_MAX | (exclusive ? AMPKIT_OPTION_MAX_EXCLUSIVE : 0u);
    s.max_value = v;
    return s;
  }
  // The default is "PRECISION=VALUE;..." (see AMPKIT_OPTION_PER_PRECISION).
  constexpr OptionSpec per_precision() const {
    OptionSpec s = *this;
    s.flags |= AMPKIT_OPTION_PER_PRECISION;
    return s;
  }
};

}  // namespace ampkit

#define AMPKIT_PLUGIN_SECTION ampkit
#define AMPKIT_PLUGIN_META_SECTION "ampkitmd"

#include <ampkit/comm_backend.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>

#include <boost/dll/alias.hpp>
#include <cstring>
#include <exception>

namespace ampkit {

// The interface a plugin of each kind implements; AMPKIT_PLUGIN(kind, ...) uses these names.
using Kind_scaler = LossScaler;
using Kind_clipper = GradClipper;
using Kind_nan_policy = NanPolicy;
using Kind_comm = CommBackend;

namespace detail {

inline void write_error(char* error, size_t error_size, const char* message) noexcept {
  if (error == nullptr || error_size == 0) return;
  std::strncpy(error, message, error_size - 1);
  error[error_size - 1] = '\0';
}

// Builds Class and hands it out as the kind's interface; no exception crosses the boundary.
template <class Class, class Interface>
void* create_strategy(const void* option_values, char* error, size_t error_size) noexcept {
  try {
    const auto& values = *static_cast<const OptionValues*>(option_values);
    Interface* object = new Class(values);
    return static_cast<Strategy*>(object);
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
  } catch (...) {
    write_error(error, error_size, "unknown exception while creating the plugin");
  }
  return nullptr;
}

}  // namespace detail
}  // namespace ampkit

// Option specs of ampkit::NanDetector (nan_detector.h), for NaN policies that use it:
//   AMPKIT_PLUGIN(nan_policy, mine, MyPolicy, "...", AMPKIT_NAN_DETECTOR_OPTIONS, ...)
#define AMPKIT_NAN_DETECTOR_OPTIONS                                                                \
  ampkit::OptionSpec::Int("spike_window", "100",                                                   \
                          "Recent healthy steps whose loss and gradient norm define 'normal' for " \
                          "spike detection.")                                                      \
      .min(2)                                                                                      \
      .max(100000),                                                                                \
      ampkit::OptionSpec::Float("spike_zscore", "0",                                               \
                                "A loss or gradient norm this many standard deviations above the " \
                                "window's mean is a spike; 0 turns spike detection off (6 is a "   \
                                "cautious starting point).")                                       \
          .min(0),                                                                                 \
      ampkit::OptionSpec::Int("spike_min_samples", "20",                                           \
                              "Healthy steps needed in the window before spikes are judged.")      \
          .min(2)

#ifndef AMPKIT_PLUGIN_VERSION
#define AMPKIT_PLUGIN_VERSION AMPKIT_VERSION_STRING
#endif

#define AMPKIT_PLUGIN_ENTRY_NAME_(abi, kind, name) ampkit_v##abi##_##kind##_##name
#define AMPKIT_PLUGIN_ENTRY_NAME_X(abi, kind, name) AMPKIT_PLUGIN_ENTRY_NAME_(abi, kind, name)
#define AMPKIT_PLUGIN_ENTRY_NAME(kind, name) AMPKIT_PLUGIN_ENTRY_NAME_X(AMPKIT_ABI_VERSION, kind, name)
#define AMPKIT_PLUGIN_ALIAS_(entry, alias) BOOST_DLL_ALIAS_SECTIONED(entry, alias, ampkit)
#define AMPKIT_PLUGIN_ALIAS(entry, alias) AMPKIT_PLUGIN_ALIAS_(entry, alias)

// Declares the plugin in a library: kind is scaler|clipper|nan_policy|comm, name an identifier,
// Class a subclass of the kind's interface constructible from `const ampkit::OptionValues&`,
// summary one line, then the option specs (ampkit::OptionSpec::Float(...), ...), possibly none.
#define AMPKIT_PLUGIN(kind, name, Class, summary, ...)                                                       \
  namespace {                                                                                                \
  const ampkit_option_spec ampkit_plugin_options_[] = {ampkit_option_spec{}, __VA_ARGS__};                   \
  static_assert(sizeof(summary) > 1, "a plugin needs a one-line summary");                                   \
  void* ampkit_plugin_create_(const void* values, char* error, size_t error_size) {                          \
    return ::ampkit::detail::create_strategy<Class, ::ampkit::Kind_##kind>(values, error, error_size);       \
  }                                                                                                          \
  const ampkit_plugin_descriptor ampkit_plugin_descriptor_ = {                                               \
      AMPKIT_ABI_VERSION,                                                                                    \
      sizeof(ampkit_plugin_descriptor),                                                                      \
      #kind,                                                                                                 \
      #name,                                                                                                 \
      AMPKIT_PLUGIN_VERSION,                                                                                 \
      summary,                                                                                               \
      AMPKIT_TORCH_VERSION,                                                                                  \
      AMPKIT_COMPILER,                                                                                       \
      AMPKIT_CXX11_ABI,                                                                                      \
      static_cast<uint32_t>(sizeof(ampkit_plugin_options_) / sizeof(ampkit_option_spec) - 1),                \
      ampkit_plugin_options_ + 1,                                                                            \
      &ampkit_plugin_create_};                                                                               \
  const ampkit_plugin_descriptor* ampkit_plugin_entry_() {                                                   \
    return &ampkit_plugin_descriptor_;                                                                       \
  }                                                                                                          \
  __attribute__((section(AMPKIT_PLUGIN_META_SECTION), used))                                                 \
  const char ampkit_plugin_meta_[] = "ampkit-plugin\nabi=" AMPKIT_STRINGIFY(                                 \
      AMPKIT_ABI_VERSION) "\nkind=" #kind "\nname=" #name "\nversion=" AMPKIT_PLUGIN_VERSION                 \
                          "\nsummary=" summary "\ntorch=" AMPKIT_TORCH_VERSION "\ncompiler=" AMPKIT_COMPILER \
                          "\ncxx11_abi=" AMPKIT_STRINGIFY(AMPKIT_CXX11_ABI) "\n";                            \
  }                                                                                                          \
  AMPKIT_PLUGIN_ALIAS(ampkit_plugin_entry_, AMPKIT_PLUGIN_ENTRY_NAME(kind, name))
