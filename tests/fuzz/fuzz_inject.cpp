// Fuzz target: --inject specs (parse_fault, then validate_faults against a small model's layers),
// one spec per input line.
#include "config/fault_spec.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<ampkit::Fault> faults;
  for (const std::string& spec : ampkit::fuzz::lines(data, size))
    ampkit::fuzz::refuse_only_with_error([&] { faults.push_back(ampkit::train::parse_fault(spec)); });
  ampkit::fuzz::refuse_only_with_error([&] {
    ampkit::train::validate_faults(faults, {"layers.0", "layers.1", "head"}, /*world_size=*/2);
  });
  return 0;
}
