// Fuzz target: ampkit-train's configuration. A first byte of 'y' makes the rest a YAML/JSON file
// given with --config (YAML to option words, then the command-line parser and every check);
// anything else makes each input line one command-line word.
#include "config/train_config.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words = {"ampkit-train"};
  if (size > 0 && data[0] == 'y') {
    words.push_back("--config");
    words.push_back(ampkit::fuzz::write_file("config.yaml", data + 1, size - 1).string());
  } else {
    for (const std::string& w : ampkit::fuzz::lines(data, size)) words.push_back(w);
  }
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  ampkit::fuzz::refuse_only_with_error(
      [&] { (void)ampkit::parse_train_config(static_cast<int>(argv.size()), argv.data()); });
  return 0;
}
