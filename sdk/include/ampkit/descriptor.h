// The C ABI between the ampkit host and a plugin library: one descriptor, one entry, one macro.
// This header names no kind: include the kind's header (ampkit/loss_scaler.h, grad_clipper.h,
// nan_policy.h, comm_backend.h) or its *_plugin.h, which includes both. It includes no ATen and
// no Boost: a scaler or NaN-policy plugin compiles and links without touching torch.
//
// A plugin library exports exactly one entry, `ampkit_v<ABI>_<kind>_<name>`: a pointer to its
// entry function in the ELF section "ampkit" (the layout of BOOST_DLL_ALIAS_SECTIONED; the host
// finds it with its own ELF reader and resolves it with Boost.DLL's get_alias), plus two
// read-only records the host reads from the file without running plugin code: "ampkitmd" (abi,
// kind, name, version, summary, torch version, compiler) and "ampkitly" (the layout of every type
// that crosses the boundary, see ampkit/layout.h). The host checks the ABI, torch and C++ ABI,
// the kind and the layouts, and only then loads the library and calls the entry.
#pragma once

#include <ampkit/layout.h>
#include <ampkit/option_text.h>
#include <ampkit/options.h>
#include <ampkit/strategy.h>
#include <ampkit/version.h>
#include <stddef.h>
#include <stdint.h>

#include <array>
#include <cstring>
#include <exception>

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
  const char* kind;      // a name of ampkit/kinds.h: "scaler" | "clipper" | ... | "fp8_recipe"
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

// The range an int or float option declares (AMPKIT_OPTION_HAS_MIN, ..._MAX_EXCLUSIVE).
inline NumberRange declared_range(const ampkit_option_spec& spec) {
  NumberRange r;
  if (spec.flags & AMPKIT_OPTION_HAS_MIN) r.min = spec.min_value;
  if (spec.flags & AMPKIT_OPTION_HAS_MAX) r.max = spec.max_value;
  r.min_exclusive = (spec.flags & AMPKIT_OPTION_MIN_EXCLUSIVE) != 0;
  r.max_exclusive = (spec.flags & AMPKIT_OPTION_MAX_EXCLUSIVE) != 0;
  return r;
}

}  // namespace ampkit

namespace ampkit::detail {

// One argument of AMPKIT_PLUGIN after the class: the summary first, then option specs.
struct PluginArgument {
  constexpr PluginArgument(const char* summary_text) : summary(summary_text), spec{} {}           // NOLINT
  constexpr PluginArgument(const ampkit_option_spec& option) : summary(nullptr), spec(option) {}  // NOLINT
  const char* summary;
  ampkit_option_spec spec;
};

constexpr bool is_empty_text(const char* s) {
  return s == nullptr || s[0] == '\0';
}

// The option specs of AMPKIT_PLUGIN's arguments, after an empty first entry (so a plugin without
// options still has an array). A misplaced summary or an empty help text stops the build.
template <size_t N>
constexpr std::array<ampkit_option_spec, N> option_table(const PluginArgument (&arguments)[N]) {
  std::array<ampkit_option_spec, N> table{};
  if (arguments[0].summary == nullptr || is_empty_text(arguments[0].summary))
    throw "AMPKIT_PLUGIN: the argument after the class must be a one-line summary";
  for (size_t i = 1; i < N; ++i) {
    if (arguments[i].summary != nullptr) throw "AMPKIT_PLUGIN: only the first argument is a summary";
    if (is_empty_text(arguments[i].spec.name)) throw "AMPKIT_PLUGIN: an option has no name";
    if (is_empty_text(arguments[i].spec.help)) throw "AMPKIT_PLUGIN: an option has an empty help text";
    table[i] = arguments[i].spec;
  }
  return table;
}

constexpr bool same_text(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

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

}  // namespace ampkit::detail

#define AMPKIT_PLUGIN_SECTION ampkit
#define AMPKIT_PLUGIN_META_SECTION "ampkitmd"

#ifndef AMPKIT_PLUGIN_VERSION
#define AMPKIT_PLUGIN_VERSION AMPKIT_VERSION_STRING
#endif

#define AMPKIT_PLUGIN_ENTRY_NAME_(abi, kind, name) ampkit_v##abi##_##kind##_##name
#define AMPKIT_PLUGIN_ENTRY_NAME_X(abi, kind, name) AMPKIT_PLUGIN_ENTRY_NAME_(abi, kind, name)
#define AMPKIT_PLUGIN_ENTRY_NAME(kind, name) AMPKIT_PLUGIN_ENTRY_NAME_X(AMPKIT_ABI_VERSION, kind, name)
// The exported alias, laid out as BOOST_DLL_ALIAS_SECTIONED lays it out (a weak, default-visible
// `const void*` in the section): the host's ELF reader lists it and Boost.DLL's get_alias resolves it.
#define AMPKIT_PLUGIN_ALIAS_(entry, alias)                                            \
  namespace _autoaliases {                                                            \
  extern "C" __attribute__((visibility("default"))) const void* alias;                \
  __attribute__((section("ampkit"), weak, visibility("default"))) const void* alias = \
      reinterpret_cast<const void*>(reinterpret_cast<intptr_t>(&entry));              \
  }
#define AMPKIT_PLUGIN_ALIAS(entry, alias) AMPKIT_PLUGIN_ALIAS_(entry, alias)
#define AMPKIT_PLUGIN_FIRST_(first, ...) first

// ampkit_add_plugin(KIND k NAME n) defines these; AMPKIT_PLUGIN must say the same.
#if defined(AMPKIT_BUILD_KIND) && defined(AMPKIT_BUILD_NAME)
#define AMPKIT_PLUGIN_CHECK_BUILD_(kind, name)                                                        \
  static_assert(::ampkit::detail::same_text(#kind, AMPKIT_BUILD_KIND),                                \
                "AMPKIT_PLUGIN(" #kind ", ...) disagrees with ampkit_add_plugin(KIND ...) in CMake"); \
  static_assert(::ampkit::detail::same_text(#name, AMPKIT_BUILD_NAME),                                \
                "AMPKIT_PLUGIN(..., " #name ", ...) disagrees with ampkit_add_plugin(NAME ...) in CMake");
#else
#define AMPKIT_PLUGIN_CHECK_BUILD_(kind, name)
#endif

// Declares the plugin in a library:
//   AMPKIT_PLUGIN(kind, name, Class, "One-line summary", option specs...)
// kind is one of ampkit/kinds.h (its interface header must be included), name an identifier,
// Class a subclass of the kind's interface constructible from `const ampkit::OptionValues&`,
// then the summary (a string literal) and the option specs (ampkit::OptionSpec::Float(...), ...),
// possibly none. Every option needs a name and a one-sentence help.
// (Through AMPKIT_PLUGIN_IMPL_, so a kind or name given as a macro is expanded once, the same way
// for the descriptor, the records and the build check.)
#define AMPKIT_PLUGIN(kind, name, ...) AMPKIT_PLUGIN_IMPL_(kind, name, __VA_ARGS__)
#define AMPKIT_PLUGIN_IMPL_(kind, name, Class, ...)                                                         \
  AMPKIT_PLUGIN_CHECK_BUILD_(kind, name)                                                                    \
  namespace {                                                                                               \
  constexpr ::ampkit::detail::PluginArgument ampkit_plugin_arguments_[] = {__VA_ARGS__};                    \
  constexpr auto ampkit_plugin_options_ = ::ampkit::detail::option_table(ampkit_plugin_arguments_);         \
  void* ampkit_plugin_create_(const void* values, char* error, size_t error_size) {                         \
    return ::ampkit::detail::create_strategy<Class, ::ampkit::interface_of::kind>(values, error,            \
                                                                                  error_size);              \
  }                                                                                                         \
  const ampkit_plugin_descriptor ampkit_plugin_descriptor_ = {                                              \
      AMPKIT_ABI_VERSION,                                                                                   \
      sizeof(ampkit_plugin_descriptor),                                                                     \
      #kind,                                                                                                \
      #name,                                                                                                \
      AMPKIT_PLUGIN_VERSION,                                                                                \
      AMPKIT_PLUGIN_FIRST_(__VA_ARGS__, ~),                                                                 \
      AMPKIT_TORCH_VERSION,                                                                                 \
      AMPKIT_COMPILER,                                                                                      \
      AMPKIT_CXX11_ABI,                                                                                     \
      static_cast<uint32_t>(ampkit_plugin_options_.size() - 1),                                             \
      ampkit_plugin_options_.data() + 1,                                                                    \
      &ampkit_plugin_create_};                                                                              \
  const ampkit_plugin_descriptor* ampkit_plugin_entry_() {                                                  \
    return &ampkit_plugin_descriptor_;                                                                      \
  }                                                                                                         \
  __attribute__((section(AMPKIT_PLUGIN_META_SECTION), used))                                                \
  const char ampkit_plugin_meta_[] = "ampkit-plugin\nabi=" AMPKIT_STRINGIFY(                                \
      AMPKIT_ABI_VERSION) "\nkind=" #kind "\nname=" #name "\nversion=" AMPKIT_PLUGIN_VERSION                \
                          "\nsummary=" AMPKIT_PLUGIN_FIRST_(                                                \
                              __VA_ARGS__, ~) "\ntorch=" AMPKIT_TORCH_VERSION "\ncompiler=" AMPKIT_COMPILER \
                                              "\ncxx11_abi=" AMPKIT_STRINGIFY(AMPKIT_CXX11_ABI) "\n";       \
  __attribute__((section(AMPKIT_PLUGIN_LAYOUT_SECTION),                                                     \
                 used)) constexpr ::ampkit::detail::LayoutText ampkit_plugin_layout_ =                      \
      ::ampkit::detail::plugin_layout<::ampkit::interface_of::kind>();                                      \
  }                                                                                                         \
  AMPKIT_PLUGIN_ALIAS(ampkit_plugin_entry_, AMPKIT_PLUGIN_ENTRY_NAME(kind, name))
