// A strategy's checkpointable state: a small map of named numbers, strings and number lists.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace ampkit {

using StateValue = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

// Written by Strategy::save(), stored in the checkpoint manifest as JSON (doubles round-trip
// exactly), handed back to Strategy::load(). Reading a missing key or a key of another type is
// an error naming the key, so a plugin never resumes from half a state.
class State {
 public:
  // Stores one of StateValue's types; any other integer type (int, size_t, ...) is stored as
  // int64_t (an unsigned value above INT64_MAX is refused), a C string as std::string.
  template <class T>
  void set(const std::string& key, T value) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t))
        if (value > static_cast<T>(INT64_MAX))
          throw std::out_of_range("state key '" + key + "': value does not fit in int64_t");
      values_[key] = StateValue(static_cast<int64_t>(value));
    } else {
      static_assert(
          is_state_type<T>(),
          "ampkit::State stores bool, integers (as int64_t), double, std::string and std::vector<double>");
      values_[key] = StateValue(std::move(value));
    }
  }
  void set(const std::string& key, const char* value) { values_[key] = StateValue(std::string(value)); }

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  bool empty() const { return values_.empty(); }
  const std::map<std::string, StateValue>& values() const { return values_; }

  // T is one of StateValue's types: read any integer as int64_t.
  template <class T>
  const T& get(const std::string& key) const {
    static_assert(
        is_state_type<T>(),
        "ampkit::State::get<T>: T must be bool, int64_t, double, std::string or std::vector<double> "
        "(integers are stored as int64_t)");
    auto it = values_.find(key);
    if (it == values_.end()) throw std::runtime_error("state has no key '" + key + "'");
    const T* v = std::get_if<T>(&it->second);
    if (v == nullptr) throw std::runtime_error("state key '" + key + "' has another type");
    return *v;
  }

  friend bool operator==(const State& a, const State& b) { return a.values_ == b.values_; }

 private:
  template <class T>
  static constexpr bool is_state_type() {
    return std::is_same_v<T, bool> || std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
           std::is_same_v<T, std::string> || std::is_same_v<T, std::vector<double>>;
  }
  std::map<std::string, StateValue> values_;
};

}  // namespace ampkit
