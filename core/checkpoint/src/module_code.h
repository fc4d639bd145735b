// The code records of archives LibTorch's TorchScript frontend compiles (torch::jit::load, under
// torch::serialize::InputArchive too), checked first: its parser recurses per nested expression
// and overflows the stack on deep nesting (a segfault, not an exception).
#pragma once

#include <string>
#include <string_view>

namespace ampkit::checkpoint_files {

// Throws std::runtime_error (one line naming the first line that does not fit) unless `code` is
// what torch::serialize::OutputArchive writes for a module of attributes: classes
// `class Module(Module):`, each line under one either `__parameters__ = [...]`,
// `__buffers__ = [...]` or `__annotations__ = []` (lists of quoted names), or an attribute's type,
// `name : T` or `__annotations__["name"] = T`, where T is Tensor, str, int, float, bool, a
// `__torch__.Module` or `__torch__.___torch_mangle_<n>.Module`, or Tuple/List/Optional of at most
// kMaxTypeDepth levels. Names are letters, digits and `_ / . -`. Nothing else reaches the frontend, whose
// parser recurses per nested expression.
void check_module_code(std::string_view code);

// For any TorchScript code (a --model file's): throws std::runtime_error (one line) when a
// statement nests deeper than kMaxCodeDepth, counting the brackets open and every prefix operator
// (unary - + ~, not, lambda) and ** so far in the statement. The frontend overflows an 8 MiB stack
// at about 5,000 nested lists and 20,000 parentheses; torch.jit.save's own code nests tens deep.
// Partial: the frontend recurses in other ways too (long operator chains, conditional
// expressions, elif chains, type comments, many lines) that this does not count.
constexpr int kMaxCodeDepth = 1000;
void check_code_nesting(std::string_view code);

// Which records of an archive LibTorch reads as pickles (.pkl, .debug_pkl) or compiles as code
// (.py), matched ignoring case as its zip library (miniz) finds them.
bool is_pickle_record(const std::string& name);
bool is_code_record(const std::string& name);

}  // namespace ampkit::checkpoint_files
