// A zip archive's central directory, checked before LibTorch's reader opens the archive.
#pragma once

#include <caffe2/serialize/read_adapter_interface.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ampkit::checkpoint_files {

// PyTorchStreamReader's constructor reads records (version or .data/version, and
// .data/serialization_id) into buffers of their declared uncompressed size before any check of
// ours can run: a deflated record declaring gigabytes (a zip bomb, or a forged size) would be
// allocated and inflated there. This walks the directory as miniz (the reader's zip library) does
// and throws std::runtime_error with the reason (one line; callers name the file) when
//  - the directory is not one miniz could open in the way that matters: entry counts it cannot
//    hold (miniz allocates by the count first), or entries that run past it;
//  - a record the constructor reads declares more bytes than the whole archive;
//  - with max_expansion, all records together declare more than max_expansion times the archive
//    (for readers that then read every record, as torch::jit::load does; entries may share bytes,
//    so this is the bound, not the file's size; 1 for a reader that must find every byte in the
//    file, as torch.save's uncompressed records are).
// Other records are left to the caller, which bounds each before it reads it (Archive::read).
// What torch.save, torch.jit.save and Python's zipfile write passes: torch.jit.save deflates its
// code and debug records, which may declare more than the file, but not its version record.
void check_zip_directory(const caffe2::serialize::ReadAdapterInterface& archive,
                         std::optional<uint64_t> max_expansion = std::nullopt);

}  // namespace ampkit::checkpoint_files
