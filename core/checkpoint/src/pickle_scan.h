// Bounds for an archive that LibTorch's own reader loads (torch::serialize::InputArchive, which
// builds the whole pickle recursively): checked first, without building anything.
#pragma once

#include <cstddef>
#include <string>

namespace ampkit::checkpoint_files {

// Error(checkpoint) naming `where` unless the archive's records together declare no more bytes
// than it has, and each of its pickles nests at most kMaxDepth deep, holds at most kMaxContainers
// containers and objects, never changes a container after placing it in another (no cycles), numbers
// its memo as pickles do, and uses only the opcodes LibTorch writes; and its code records (which
// LibTorch compiles) are in the form check_module_code allows. Record names are matched ignoring
// case, as LibTorch's zip library finds them.
void check_torch_archive(const void* data, size_t size, const std::string& where);

}  // namespace ampkit::checkpoint_files
