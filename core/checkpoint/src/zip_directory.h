// A zip archive's central directory, checked before LibTorch's reader opens the archive.
#pragma once

#include <caffe2/serialize/read_adapter_interface.h>

#include <string>

namespace ampkit::checkpoint_files {

// PyTorchStreamReader's constructor already reads two records (version, .data/serialization_id),
// each into a buffer of its declared uncompressed size, before any check of ours can run: a
// deflated record declaring gigabytes (a zip bomb, or a forged size) would be allocated and
// inflated there. This walks the directory the way miniz (the reader's zip library) finds it and
// throws std::runtime_error with the reason (one line; callers name the file) when the directory
// is not one miniz could open (counts that do not fit it: miniz would allocate by them first) or
// when any record declares more bytes than the whole archive holds. Everything torch.save writes
// passes: it stores records uncompressed.
void check_zip_directory(const caffe2::serialize::ReadAdapterInterface& archive);

}  // namespace ampkit::checkpoint_files
