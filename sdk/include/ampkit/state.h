// A strategy's checkpointable state: a small map of named numbers, strings and number lists.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace ampkit {

using StateValue = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

// Written by Strategy::save(), stored in the checkpoint manifest as JSON (doubles round-trip
// exactly), handed back to Strategy::load(). Reading a missing key or a key of another type is
// an error naming the key, so a plugin never resumes from half a state.
class State {
 public:
  template <class T>
  void set(const std::string& key, T value) {
    values_[key] = StateValue(std::move(value));
  }
  void set(const std::string& key, int value) { values_[key] = StateValue(int64_t{value}); }
  void set(const std::string& key, const char* value) { values_[key] = StateValue(std::string(value)); }

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  bool empty() const { return values_.empty(); }
  const std::map<std::string, StateValue>& values() const { return values_; }

  template <class T>
  const T& get(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end()) throw std::runtime_error("state has no key '" + key + "'");
    const T* v = std::get_if<T>(&it->second);
    if (v == nullptr) throw std::runtime_error("state key '" + key + "' has another type");
    return *v;
  }

  friend bool operator==(const State& a, const State& b) { return a.values_ == b.values_; }

 private:
  std::map<std::string, StateValue> values_;
};

}  // namespace ampkit
