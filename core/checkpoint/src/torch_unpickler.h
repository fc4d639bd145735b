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
c10::IValue load_torch_file(const std::filesystem::path& file, const std::string& where);

}  // namespace ampkit::checkpoint_files
