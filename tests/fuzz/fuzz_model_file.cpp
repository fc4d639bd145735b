// Fuzz target: a --model file up to torch::jit::load (open_module_archive: the zip directory, the
// records' declared sizes, and the code records' nesting), not the TorchScript frontend itself,
// which compiles whatever code passes. Those checks refuse with std::runtime_error (the host turns
// it into "is not a TorchScript module (...)", exit 4); LibTorch's reader with c10::Error.
#include <c10/util/Exception.h>

#include <stdexcept>

#include "ampkit/pytorch_state.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = ampkit::fuzz::write_file("model.pt", data, size);
  ampkit::fuzz::refuse_only_with_error([&] {
    try {
      (void)ampkit::open_module_archive(file, ampkit::ErrorCategory::data, "--model");
    } catch (const c10::Error&) {
    } catch (const std::runtime_error&) {
    }
  });
  return 0;
}
