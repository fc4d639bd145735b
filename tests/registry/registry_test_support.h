// Helpers shared by the registry suites: isolated registries, caught errors, substring checks.
#pragma once

#include <ampkit/error.h>
#include <ampkit/registry.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace ampkit {
// Lets BOOST_TEST print error categories when a comparison fails.
inline std::ostream& operator<<(std::ostream& out, ErrorCategory category) {
  return out << "ErrorCategory(" << static_cast<int>(category) << ")";
}
}  // namespace ampkit

namespace ampkit::test {

namespace fs = std::filesystem;

inline const fs::path kPluginDir = ampkit::test::plugin_dir();
inline const fs::path kBrokenDir = ampkit::test::broken_dir();

// Options that make a registry see exactly `dirs`: no AMPKIT_PLUGIN_PATH, no default folders.
inline ampkit::RegistryOptions only(std::vector<fs::path> dirs) {
  ampkit::RegistryOptions o;
  o.plugin_dirs = std::move(dirs);
  o.use_environment = false;
  o.use_default_dirs = false;
  return o;
}

// What a call that should fail with ampkit::Error threw; `thrown` is false when it returned or
// threw something else (then `message` says what).
struct Caught {
  bool thrown = false;
  ampkit::ErrorCategory code = ampkit::ErrorCategory::internal;
  std::string message;
};

template <class F>
Caught catch_error(F&& f) {
  Caught c;
  try {
    f();
    c.message = "(no exception)";
  } catch (const ampkit::Error& e) {
    c.thrown = true;
    c.code = e.category();
    c.message = e.what();
  } catch (const std::exception& e) {
    c.message = std::string("(not an ampkit::Error: ") + e.what() + ")";
  }
  return c;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace ampkit::test

// Checks that `text` contains `part`, printing the whole text when it does not.
#define AMPKIT_CHECK_CONTAINS(text, part)                       \
  BOOST_CHECK_MESSAGE(::ampkit::test::contains((text), (part)), \
                      "expected \"" << (part) << "\" in: \"" << (text) << "\"")
#define AMPKIT_CHECK_NOT_CONTAINS(text, part)                    \
  BOOST_CHECK_MESSAGE(!::ampkit::test::contains((text), (part)), \
                      "did not expect \"" << (part) << "\" in: \"" << (text) << "\"")
// Checks that `caught` is an ampkit::Error with `exit_code`, printing the message otherwise.
#define AMPKIT_REQUIRE_ERROR(caught, exit_code)                                                              \
  do {                                                                                                       \
    BOOST_REQUIRE_MESSAGE((caught).thrown, "expected ampkit::Error, got " << (caught).message);              \
    BOOST_CHECK_MESSAGE((caught).code == (exit_code), "exit code " << (caught).code << " != " << (exit_code) \
                                                                   << " for: " << (caught).message);         \
  } while (0)
