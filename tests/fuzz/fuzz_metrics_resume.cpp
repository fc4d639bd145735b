// Fuzz target: the metrics and layer-norm readers of a resumed run, which keep the records of
// the steps before the resume point from whatever file is there. The first input line is that
// step; the rest is the existing file.
#include <cstdlib>

#include "ampkit/metrics.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t head = 0;
  while (head < size && head < 20 && data[head] != '\n') ++head;
  const std::string first(reinterpret_cast<const char*>(data), head);
  const int64_t first_step = std::strtoll(first.c_str(), nullptr, 10);
  const size_t skip = head < size ? head + 1 : head;
  const auto metrics = ampkit::fuzz::write_file("metrics.jsonl", data + skip, size - skip);
  const auto norms = ampkit::fuzz::write_file("layer_norms.csv", data + skip, size - skip);
  ampkit::fuzz::refuse_only_with_error([&] { ampkit::MetricsWriter keep(metrics, first_step); });
  ampkit::fuzz::refuse_only_with_error([&] { ampkit::LayerNormWriter keep(norms, first_step); });
  return 0;
}
