// TensorBoard event files: what `--tensorboard DIR` writes (docs/configuration.md, "TensorBoard").
#pragma once

#include <ampkit/step_record.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ampkit {

// One events.out.tfevents.* file in a folder: TFRecord framing (length, masked CRC-32C of the
// length, the Event protobuf, its masked CRC-32C), each Event a scalar summary. The protobuf
// messages (Event, Summary, Summary.Value, SessionLog) are encoded here, a handful of fields by
// hand: linking a protobuf library would put a second copy of protobuf beside the one libtorch
// exports. Flushed after every step.
class TensorBoardWriter {
 public:
  // Empty folder: disabled. `first_step` > 0 (a resumed run) writes a SessionLog START there,
  // so TensorBoard drops the earlier files' records from that step on.
  explicit TensorBoardWriter(const std::filesystem::path& folder, int64_t first_step = 0);
  bool enabled() const { return out_.is_open(); }
  const std::filesystem::path& file() const { return file_; }

  // Scalars of one step, tag -> value, in one Event.
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // A step's record: the scalars of docs/configuration.md's table, and "layer_norms/<name>" for
  // every parameter when `names` is given.
  void write_step(const StepRecord& record, const std::vector<std::string>& names = {},
                  const std::vector<double>& norms = {});

 private:
  void write_event(const std::string& event);
  std::filesystem::path file_;
  std::ofstream out_;
};

// CRC-32C (Castagnoli) and TFRecord's mask of it; exposed for the tests.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace ampkit
