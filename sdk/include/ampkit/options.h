// Option specs a plugin declares (name, type, default, range, help) and the typed values it gets.
#pragma once

#include <ampkit/option_text.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

extern "C" struct ampkit_option_spec;

namespace ampkit {

// Shortest text that reads back as the same double; whole numbers in full ("100000", not
// "1e+05"), as users type them. For messages that quote an option value.
inline std::string format_number(double v) {
  if (std::isfinite(v) && std::fabs(v) < 1e15 && v == std::floor(v))
    return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

// The error a plugin's constructor throws for a bad option value, worded like the host's own:
// "option 'growth_factor' of scaler 'dynamic' must be > 1, got 0.5".
inline std::invalid_argument option_error(const std::string& plugin, const std::string& option,
                                          const std::string& value, const std::string& accepted) {
  return std::invalid_argument("option '" + option + "' of " + plugin + " must be " + accepted + ", got " +
                               value);
}

// Values of a plugin's options after the host has merged command line, environment, YAML file
// and defaults and validated each against its spec. Unset options (no default, not given) are
// absent: check has() before reading them.
class OptionValues {
 public:
  void set(const std::string& name, const std::string& text) { values_[name] = text; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::map<std::string, std::string>& all() const { return values_; }

  const std::string& get_string(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw std::invalid_argument("option '" + name + "' is not set");
    return it->second;
  }
  double get_float(const std::string& name) const { return std::stod(get_string(name)); }
  int64_t get_int(const std::string& name) const { return std::stoll(get_string(name)); }
  bool get_bool(const std::string& name) const { return parse_bool_text(get_string(name)).value_or(false); }
  double get_float(const std::string& name, double fallback) const {
    return has(name) ? get_float(name) : fallback;
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace ampkit
