// How an option's text reads, declared once for the registry, ampkit::testing and ampkit-train's
// own options: the spellings of true and false, and whether a number lies in a declared range.
#pragma once

#include <optional>
#include <string>

namespace ampkit {

// true for "true", "1", "yes", "on"; false for "false", "0", "no", "off"; nothing otherwise.
inline std::optional<bool> parse_bool_text(const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  return std::nullopt;
}

// A declared range: each bound optional, inclusive unless marked exclusive. NaN is in no range
// that has a bound.
struct NumberRange {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;

  bool contains(double v) const {
    if (min && (min_exclusive ? !(v > *min) : !(v >= *min))) return false;
    return !(max && (max_exclusive ? !(v < *max) : !(v <= *max)));
  }
};

}  // namespace ampkit
