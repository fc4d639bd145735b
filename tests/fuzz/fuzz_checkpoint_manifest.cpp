// Fuzz target: a checkpoint's manifest and the plugin State JSON inside it. The input becomes
// manifest.json of a checkpoint folder whose manifest.sha256 matches it (so the checksum lets it
// through to the parser, as a hand-edited checkpoint would), then read_checkpoint reads the folder.
#include "ampkit/checkpoint.h"
#include "ampkit/sha256.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto folder = ampkit::fuzz::scratch() / "step-00000001";
  std::filesystem::create_directories(folder);
  ampkit::fuzz::write_file("step-00000001/manifest.json", data, size);
  ampkit::Sha256 digest;
  digest.update(data, size);
  const std::string line = digest.hex() + "  manifest.json\n";
  ampkit::fuzz::write_file("step-00000001/manifest.sha256", reinterpret_cast<const uint8_t*>(line.data()),
                           line.size());
  ampkit::fuzz::refuse_only_with_error([&] { (void)ampkit::read_checkpoint(folder); });
  return 0;
}
