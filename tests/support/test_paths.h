// The folders the tests read and run from, set by CMake in one generated source (test_paths.cpp.in):
// the build's bin/ and plugin folders, the broken plugins' folder, the source tree and its
// tests/data. Compile definitions with these absolute paths would make every test's compile
// differ between two checkouts, so ccache could not serve a fresh clone's (CI's) test programs;
// only the generated file differs now.
#pragma once

namespace ampkit::test {

const char* bin_dir();
const char* plugin_dir();
const char* broken_dir();
const char* data_dir();
const char* source_dir();

}  // namespace ampkit::test
