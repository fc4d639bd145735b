// Reading the torchscript workload's tensors (docs/your-own-model.md, "Data").
#include "workloads/torchscript_data.h"

#include <ATen/ops/cat.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/pytorch_state.h"

namespace fs = std::filesystem;

namespace ampkit::train {

namespace {

at::Tensor tensor_at(const c10::impl::GenericDict& d, const std::string& key, const std::string& where) {
  const auto it = d.find(c10::IValue(key));
  if (it == d.end() || !it->value().isTensor())
    throw Error(ErrorCategory::data,
                where + " has no tensor \"" + key +
                    "\": save the data with torch.save({\"inputs\": X, \"targets\": Y}, FILE)");
  at::Tensor t = it->value().toTensor();
  if (t.dim() == 0)
    throw Error(ErrorCategory::data, where + ": \"" + key + "\" must have a sample dimension");
  return t.contiguous();
}

TensorData read_file(const fs::path& file, const std::string& where) {
  c10::IValue top;
  try {
    top = read_torch_file(file, where);
  } catch (const Error& e) {
    throw Error(ErrorCategory::data, e.what());
  }
  if (!top.isGenericDict())
    throw Error(ErrorCategory::data,
                where + " holds a " + top.tagKind() +
                    ", not a dict: save the data with torch.save({\"inputs\": X, \"targets\": "
                    "Y}, FILE)");
  const c10::impl::GenericDict d = top.toGenericDict();
  TensorData data{tensor_at(d, "inputs", where), tensor_at(d, "targets", where)};
  if (data.inputs.size(0) != data.targets.size(0))
    throw Error(ErrorCategory::data, where + ": \"inputs\" holds " + std::to_string(data.inputs.size(0)) +
                                         " samples and \"targets\" " + std::to_string(data.targets.size(0)) +
                                         "; they must be the same length along dimension 0");
  return data;
}

// Shards agree on everything but their length.
void check_same_kind(const at::Tensor& first, const at::Tensor& next, const std::string& key,
                     const std::string& where) {
  if (first.scalar_type() != next.scalar_type() || first.sizes().slice(1) != next.sizes().slice(1))
    throw Error(ErrorCategory::data, where + ": \"" + key + "\" is " + c10::toString(next.scalar_type()) +
                                         " " + c10::str(next.sizes()) + " where the first shard's is " +
                                         c10::toString(first.scalar_type()) + " " + c10::str(first.sizes()) +
                                         " (shards may differ only in length)");
}

// Why `path` cannot be a shard, or "" when it is a regular file (or a symlink to one): a folder
// entry of another type would otherwise be skipped without a word, and the run would train on less
// data than the folder names.
std::string not_a_regular_file(const fs::path& path) {
  std::error_code ec;
  const fs::file_status target = fs::status(path, ec);
  if (fs::is_regular_file(target)) return "";
  if (ec && ec != std::errc::no_such_file_or_directory) return "cannot be examined: " + ec.message();
  std::string kind = "not a regular file";
  if (target.type() == fs::file_type::directory) kind = "a folder";
  if (target.type() == fs::file_type::fifo) kind = "a FIFO";
  if (target.type() == fs::file_type::character) kind = "a character device";
  if (target.type() == fs::file_type::block) kind = "a block device";
  if (target.type() == fs::file_type::socket) kind = "a socket";
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return "is " + kind;
  const std::string to = fs::read_symlink(path, ec).string();
  if (target.type() == fs::file_type::not_found)
    return "is a dangling symlink (to " + to + ", which does not exist)";
  return "is a symlink to " + to + ", " + kind;
}

}  // namespace

TensorData read_tensor_data(const std::string& path, const std::string& option) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return read_file(path, option + " " + path);
  if (!fs::is_directory(path, ec))
    throw Error(ErrorCategory::data, option + " " + path + " is neither a file nor a folder");
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (entry.path().extension() == ".pt") shards.push_back(entry.path());
  if (ec) throw Error(ErrorCategory::data, option + " " + path + " cannot be listed: " + ec.message());
  for (const auto& shard : shards)
    if (const std::string why = not_a_regular_file(shard); !why.empty())
      throw Error(ErrorCategory::data, option + " shard " + shard.string() + " " + why +
                                           ": every *.pt entry of the folder must be a regular file "
                                           "(or a symlink to one)");
  if (shards.empty()) throw Error(ErrorCategory::data, option + " " + path + " holds no *.pt shard");
  std::sort(shards.begin(), shards.end());
  std::vector<at::Tensor> inputs, targets;
  for (const auto& shard : shards) {
    const std::string where = option + " shard " + shard.string();
    TensorData d = read_file(shard, where);
    if (!inputs.empty()) {
      check_same_kind(inputs.front(), d.inputs, "inputs", where);
      check_same_kind(targets.front(), d.targets, "targets", where);
    }
    inputs.push_back(d.inputs);
    targets.push_back(d.targets);
  }
  return {at::cat(inputs), at::cat(targets)};
}

void check_target_dtype(const TensorData& data, const std::string& loss, const std::string& option) {
  const at::ScalarType t = data.targets.scalar_type();
  const std::string name = c10::toString(t);
  if (loss == "cross_entropy" && !(at::isIntegralType(t, false) || at::isFloatingType(t)))
    throw Error(ErrorCategory::data, option +
                                         ": --loss cross_entropy takes class indices (an integer dtype) or "
                                         "probabilities (a float dtype) as targets, got " +
                                         name);
  if (loss == "mse" && !at::isFloatingType(t))
    throw Error(ErrorCategory::data, option + ": --loss mse takes floating-point targets, got " + name);
}

void check_class_range(const TensorData& data, int64_t classes, const std::string& option) {
  if (!at::isIntegralType(data.targets.scalar_type(), false) || data.size() == 0) return;
  const at::Tensor all = data.targets.to(at::kLong);
  const at::Tensor t = all.dim() == 1 ? all.unsqueeze(1) : all.flatten(1);  // [samples, positions]
  const at::Tensor bad = t.lt(0).logical_and(t.ne(kIgnoredClass)).logical_or(t.ge(classes));
  if (!bad.any().item<bool>()) return;
  const int64_t sample = bad.any(1).nonzero()[0][0].item<int64_t>();
  const int64_t value = t[sample].masked_select(bad[sample])[0].item<int64_t>();
  throw Error(ErrorCategory::data, option + ": sample " + std::to_string(sample) + " has target " +
                                       std::to_string(value) + ", not one of the model's " +
                                       std::to_string(classes) + " classes (0 to " +
                                       std::to_string(classes - 1) + ", or -100 to ignore a position)");
}

}  // namespace ampkit::train
