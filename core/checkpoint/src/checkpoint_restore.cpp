// Putting saved tensors and optimizer state back: from a checked checkpoint, or from memory.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <string>

#include "ampkit/error.h"
#include "checkpoint_files.h"
#include "pickle_scan.h"
#include "torch_unpickler.h"

namespace ampkit {

using namespace checkpoint_files;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The first difference in names, count, shapes or dtypes between the saved and the given tensors.
void check_same_model(const std::string& where, const std::vector<TensorRecord>& saved,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const size_t n = std::max(saved.size(), tensors.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= saved.size())
      fail(where + " was saved from a different model: this model has parameter '" + tensors[i].first +
           "', the checkpoint has no more parameters (" + std::to_string(saved.size()) + " in all)");
    if (i >= tensors.size())
      fail(where + " was saved from a different model: the checkpoint has parameter '" + saved[i].name +
           "', this model has no more parameters (" + std::to_string(tensors.size()) + " in all)");
    const auto& s = saved[i];
    const auto& [name, t] = tensors[i];
    const std::string dtype = c10::toString(t.scalar_type());
    if (s.name != name)
      fail(where + " was saved from a different model: parameter " + std::to_string(i) + " is '" + s.name +
           "' in the checkpoint, '" + name + "' in this model");
    if (s.shape != t.sizes().vec())
      fail(where + " was saved from a different model: parameter '" + name + "' has shape " +
           shape_text(s.shape) + " in the checkpoint, " + shape_text(t.sizes().vec()) + " in this model");
    if (s.dtype != dtype)
      fail(where + " was saved from a different model: parameter '" + name + "' has dtype " + s.dtype +
           " in the checkpoint, " + dtype + " in this model");
  }
}

// LibTorch's messages may quote the source they stopped at on the lines after the first, and the
// frontend's may start with a blank line: the first line with text.
std::string first_line(const std::string& message) {
  const size_t start = std::min(message.find_first_not_of("\n "), message.size());
  return message.substr(start, message.find('\n', start) - start);
}

}  // namespace

void restore_tensors(const LoadedCheckpoint& checkpoint,
                     const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::string where = "checkpoint " + checkpoint.folder.string();
  check_same_model(where, checkpoint.manifest.tensors, tensors);
  // The bounded reader --init-from uses: a hostile model.pt (one with a matching checksum in a
  // forged manifest) can neither nest without bound nor allocate more than its bytes.
  const c10::IValue value = load_torch_bytes(checkpoint.model_bytes.data(), checkpoint.model_bytes.size(),
                                             where + ": " + (checkpoint.folder / kModelFile).string());
  if (!value.isGenericDict())
    fail(where + ": " + (checkpoint.folder / kModelFile).string() + " does not hold a dict of tensors");
  const c10::impl::GenericDict dict = value.toGenericDict();
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) {
    auto it = dict.find(name);
    if (it == dict.end())
      fail(where + ": " + (checkpoint.folder / kModelFile).string() + " has no tensor '" + name + "'");
    if (!it->value().isTensor())
      fail(where + ": '" + name + "' in " + (checkpoint.folder / kModelFile).string() + " is not a tensor");
    const at::Tensor value = it->value().toTensor();
    if (value.sizes() != t.sizes() || value.scalar_type() != t.scalar_type())
      fail(where + ": tensor '" + name + "' in " + kModelFile + " does not match its manifest entry");
    at::Tensor target = t;
    target.copy_(value);
  }
}

void restore_optimizer(const LoadedCheckpoint& checkpoint, torch::optim::Optimizer& optimizer) {
  // LibTorch's reader builds its pickle recursively and sizes its memo by the file's indices: the
  // archive is checked against our bounds first (a hostile file under a manifest that vouches for it).
  check_torch_archive(
      checkpoint.optimizer_bytes.data(), checkpoint.optimizer_bytes.size(),
      "checkpoint " + checkpoint.folder.string() + ": " + (checkpoint.folder / kOptimizerFile).string());
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(checkpoint.optimizer_bytes.data(), checkpoint.optimizer_bytes.size());
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    fail("checkpoint " + checkpoint.folder.string() + ": the optimizer state in " + kOptimizerFile +
         " does not fit this optimizer (another --optimizer?): " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {  // the TorchScript frontend's errors, std::stoull's on a state key
    fail("checkpoint " + checkpoint.folder.string() + ": " + kOptimizerFile +
         " is not an optimizer state LibTorch can read: " + first_line(e.what()));
  }
}

void MemorySnapshot::capture(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                             torch::optim::Optimizer& optimizer, int64_t steps_attempted,
                             int64_t steps_taken) {
  torch::NoGradGuard no_grad;
  names_.clear();
  values_.clear();
  for (const auto& [name, t] : tensors) {
    names_.push_back(name);
    values_.push_back(t.detach().clone());
  }
  optimizer_ = optimizer_bytes(optimizer);
  attempted_ = steps_attempted;
  taken_ = steps_taken;
  captured_ = true;
}

int64_t MemorySnapshot::restore(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                torch::optim::Optimizer& optimizer) const {
  if (!captured_) throw Error(ErrorCategory::internal, "rollback before any snapshot was taken");
  if (tensors.size() != values_.size())
    throw Error(ErrorCategory::internal, "rollback: the model has " + std::to_string(tensors.size()) +
                                             " tensors, the snapshot " + std::to_string(values_.size()));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].first != names_[i] || tensors[i].second.sizes() != values_[i].sizes())
      throw Error(ErrorCategory::internal,
                  "rollback: tensor '" + tensors[i].first + "' does not match the snapshot");
    at::Tensor target = tensors[i].second;
    target.copy_(values_[i]);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(optimizer_.data(), optimizer_.size());
  optimizer.load(archive);
  return taken_;
}

}  // namespace ampkit
