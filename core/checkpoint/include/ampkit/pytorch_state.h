// PyTorch's own state_dict layouts, both ways: what python's torch.load(weights_only=True) reads
// from a checkpoint, and what `ampkit-train --init-from` takes from a file python's torch.save
// wrote. Files are written and read with LibTorch's pickler (torch::pickle_save/pickle_load).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/error.h"

namespace caffe2::serialize {
class ReadAdapterInterface;
}

namespace torch::optim {
class Optimizer;
}

namespace ampkit {

// torch.amp.GradScaler.state_dict(): {"scale", "growth_factor", "backoff_factor",
// "growth_interval", "_growth_tracker"}.
struct GradScalerState {
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;
};

// The optimizer's state as python's optimizer.state_dict() lays it out: {"state": {index:
// {...}}, "param_groups": [{..., "params": [indices]}]}, parameters numbered in param_groups
// order. AdamW (ampkit's fused one or LibTorch's): "step" (a float tensor, as fused AdamW keeps
// it), "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad); the group as
// torch.optim.AdamW(fused=True) has it. SGD: "momentum_buffer". Other optimizers: Error(checkpoint).
c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer);

// Loads such a state_dict into `optimizer`: the same number of groups and parameters with the
// same shapes, and the same betas / eps / weight_decay / amsgrad (or momentum); the learning rate
// stays this run's (the schedule owns it). Error(checkpoint) names the first difference, with
// `where` (the file) in front.
void load_optimizer_state_dict(const c10::IValue& state_dict, torch::optim::Optimizer& optimizer,
                               const std::string& where);

c10::IValue grad_scaler_state_dict(const GradScalerState& state);
GradScalerState grad_scaler_state_from(const c10::IValue& state_dict, const std::string& where);

// A {name: tensor} dict (CPU, contiguous) as torch.save(model.state_dict()) holds it.
c10::IValue tensor_dict(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// torch::pickle_save's bytes: the zip layout torch.save writes and torch.load reads.
std::vector<char> pickle_bytes(const c10::IValue& value);

// A file python wrote: a bare model state_dict, or {"model": ..., "optimizer": ..., "scaler": ...}
// (the GradScaler docs' checkpoint; "model_state_dict"/"optimizer_state_dict" are accepted too).
struct PyTorchStart {
  std::vector<std::pair<std::string, at::Tensor>> model;
  std::optional<c10::IValue> optimizer;
  std::optional<GradScalerState> scaler;
  // Other top-level entries of a {"model": ...} file (epoch, step, lr_scheduler...): not loaded.
  std::vector<std::string> ignored;
};
// `where` starts every error message (the host names its own option and the file).
PyTorchStart read_pytorch_file(const std::filesystem::path& file, const std::string& where);

// The object in a file python's torch.save wrote, read as torch.load(weights_only=True) reads it
// (dicts, lists, tuples, str, numbers, None and tensors; never pickled code). Error(checkpoint)
// naming `where` for anything else or a damaged file.
c10::IValue read_torch_file(const std::filesystem::path& file, const std::string& where);

// A TorchScript module's file, opened once for torch::jit::load(archive, device): a regular file,
// read without blocking, whose zip directory is checked first. LibTorch's reader allocates each
// record's declared size before it inflates it (the version record in its constructor), so a few
// hundred kilobytes could otherwise take gigabytes: a record the constructor reads may declare at
// most the file's size, and all records together at most 64 times it (torch.jit.save's deflated
// code and debug records measure 0.6 to 2.9 times). Its code records, which torch::jit::load
// compiles with a parser that recurses per nested expression, may hold at most 4 MiB in all (what
// ampkit-train's 1 GiB loading stack is sized for) and nest at most 1000 deep (check_code_nesting).
// Error(category) "<where>: cannot open FILE: ..." when it cannot be opened or is not a regular file;
// std::runtime_error with the reason (one line, no file name) for the directory or the code.
std::shared_ptr<caffe2::serialize::ReadAdapterInterface> open_module_archive(
    const std::filesystem::path& file, ErrorCategory category, const std::string& where);

// Copies `source` into `tensors` by name: every name present on both sides with the same shape
// (dtypes are converted), or Error(checkpoint) listing missing and unexpected keys and the first
// shape mismatch, as load_state_dict(strict=True) does.
void load_state_dict_into(const std::vector<std::pair<std::string, at::Tensor>>& source,
                          const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          const std::string& where);

}  // namespace ampkit
