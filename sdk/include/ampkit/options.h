// Option specs a plugin declares (name, type, default, range, help) and the typed values it gets.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

extern "C" struct ampkit_option_spec;

namespace ampkit {

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
  bool get_bool(const std::string& name) const {
    const std::string& v = get_string(name);
    return v == "true" || v == "1" || v == "yes" || v == "on";
  }
  double get_float(const std::string& name, double fallback) const {
    return has(name) ? get_float(name) : fallback;
  }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace ampkit
