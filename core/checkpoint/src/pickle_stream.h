// What both pickle readers share: torch_unpickler.cpp builds the values, pickle_scan.cpp only
// measures them. Every read is checked against the pickle's end, every pop against the stack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/error.h"

namespace ampkit::checkpoint_files {

// A pickle's bytes and its machine's stack of `T` with marks. `refusal` names the file kind in
// errors: "<where>: not a <refusal> (<what>)".
template <class T>
class PickleStream {
 protected:
  PickleStream(const char* data, size_t size, std::string where, const char* refusal)
      : p_(reinterpret_cast<const uint8_t*>(data)),
        end_(p_ + size),
        where_(std::move(where)),
        refusal_(refusal) {}

  [[noreturn]] void bad(const std::string& what) const {
    throw Error(ErrorCategory::checkpoint, where_ + ": not a " + refusal_ + " (" + what + ")");
  }
  uint8_t byte() {
    if (p_ >= end_) bad("truncated pickle");
    return *p_++;
  }
  uint64_t little(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) bad("truncated pickle");
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
    p_ += n;
    return v;
  }
  std::string text(uint64_t n) {
    if (static_cast<uint64_t>(end_ - p_) < n) bad("truncated pickle");
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  void skip(uint64_t n) {
    if (static_cast<uint64_t>(end_ - p_) < n) bad("truncated pickle");
    p_ += n;
  }
  std::string line() {
    std::string s;
    for (uint8_t c = byte(); c != '\n'; c = byte()) s.push_back(static_cast<char>(c));
    return s;
  }
  T pop() {
    if (stack_.empty()) bad("stack underflow");
    T v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::vector<T> pop_to_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) bad("MARK missing");
    std::vector<T> out(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back())),
                       std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return out;
  }

  const uint8_t* p_;
  const uint8_t* end_;
  std::string where_;
  std::string refusal_;
  std::vector<T> stack_;
  std::vector<size_t> marks_;
};

}  // namespace ampkit::checkpoint_files
