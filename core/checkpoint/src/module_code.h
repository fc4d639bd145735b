// The code records of an archive LibTorch's own reader will load (torch::serialize::InputArchive
// compiles them with the TorchScript frontend): held to the form OutputArchive writes first.
#pragma once

#include <string_view>

namespace ampkit::checkpoint_files {

// Throws std::runtime_error (one line naming the first line that does not fit) unless `code` is
// what torch::serialize::OutputArchive writes for a module of attributes: classes
// `class Module(Module):`, each line under one either `__parameters__ = [...]`,
// `__buffers__ = [...]` or `__annotations__ = []` (lists of quoted names), or an attribute's type,
// `name : T` or `__annotations__["name"] = T`, where T is Tensor, str, int, float, bool, a
// `__torch__` class, or Tuple/List/Optional of at most kMaxTypeDepth levels. Names are letters,
// digits and `_ / . -`. Nothing else reaches the frontend, whose parser recurses per nested
// expression.
void check_module_code(std::string_view code);

}  // namespace ampkit::checkpoint_files
