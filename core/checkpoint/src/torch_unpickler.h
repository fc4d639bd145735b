// Reading files python's torch.save wrote, the way torch.load(weights_only=True) does (not installed).
#pragma once

#include <ATen/core/ivalue.h>

#include <filesystem>

namespace ampkit::checkpoint_files {

// The object in a torch.save zip archive, restricted like python's weights_only unpickler: dicts
// (OrderedDict too; its attributes are dropped), lists, tuples, str, int, float, bool, None and
// tensors (typed storages, _rebuild_tensor_v2, _rebuild_parameter). Anything else, or a damaged
// file, throws Error(checkpoint) naming `where`. LibTorch's own torch::pickle_load cannot be used:
// it reads every OrderedDict (what state_dict() returns) as None.
// Bounded by the file's own bytes: nesting depth, memo and containers follow what the pickle holds,
// each record's declared size is checked against the archive before it is read, views are checked
// before they are materialized, and only regular files are opened.
c10::IValue load_torch_file(const std::filesystem::path& file, const std::string& where);
// The same, for an archive already in memory (a checkpoint's model.pt, read and checksummed).
c10::IValue load_torch_bytes(const void* data, size_t size, const std::string& where);

}  // namespace ampkit::checkpoint_files
