// Fuzz target: the ELF plugin reader and its metadata record (inspect_plugin_file, then the
// compatibility check), on any bytes presented as a plugin file. Nothing is loaded.
#include "ampkit/registry.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = ampkit::fuzz::write_file("libampkit-scaler-fuzz.so", data, size);
  ampkit::fuzz::refuse_only_with_error([&] {
    const ampkit::PluginInfo info = ampkit::inspect_plugin_file(file);
    ampkit::check_compatible(info);
  });
  return 0;
}
