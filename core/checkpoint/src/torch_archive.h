// A torch.save zip archive read within its own bytes: regular files only, and no record read
// beyond what the archive holds.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>
#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ampkit::checkpoint_files {

class Source;

// Records are read only after their declared (uncompressed) size fits what is left of the budget:
// the archive's size. Together they may not declare more bytes than the archive has, so a
// compressed record cannot inflate past what its file backs (torch.save stores records
// uncompressed). Error(checkpoint) naming `where` otherwise.
class Archive {
 public:
  // max_expansion: as check_zip_directory's, for callers that read every record afterwards.
  Archive(std::shared_ptr<Source> source, std::string where,
          std::optional<uint64_t> max_expansion = std::nullopt);
  bool has(const std::string& name) { return reader_.hasRecord(name); }
  size_t declared_size(const std::string& name) { return reader_.getRecordSize(name); }
  std::vector<std::string> records() { return reader_.getAllRecords(); }
  std::tuple<at::DataPtr, size_t> read(const std::string& name);

 private:
  size_t budget_;  // set first, from the checked directory: declared before reader_, whose constructor reads
  caffe2::serialize::PyTorchStreamReader reader_;
  std::string where_;
};

// An archive in memory (the bytes must outlive the source).
std::shared_ptr<Source> source_in_memory(const void* data, size_t size);

// The archive's object (torch_unpickler.cpp).
c10::IValue unpickle(Archive& archive, const std::string& where);

}  // namespace ampkit::checkpoint_files
