// Shared by the libFuzzer targets of tests/fuzz (tools/fuzz.sh builds and runs them): a scratch
// folder per process and the one rule every target checks. A parser of untrusted input may
// refuse it only with ampkit::Error (one clear line, a documented exit code); any other exception
// escapes the target, and libFuzzer reports it as a crash, like a signal or a sanitizer finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ampkit/error.h"

namespace ampkit::fuzz {

// A folder of this process's own, made once, removed by nothing (under the system temp folder).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("ampkit-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_file(const std::string& name, const uint8_t* data, size_t size) {
  const auto path = scratch() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// The input cut at '\n' (a trailing piece without one included).
inline std::vector<std::string> lines(const uint8_t* data, size_t size) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Runs `f`; ampkit::Error is the documented way to refuse input, so it is swallowed.
template <class F>
void refuse_only_with_error(F&& f) {
  try {
    f();
  } catch (const ampkit::Error&) {
  }
}

}  // namespace ampkit::fuzz
