// The torchscript workload's model: the user's scripted module loaded and checked, the view the
// host and the engine see it through, and its failures told in one line with its own message.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/model_view.h>
#include <torch/csrc/jit/api/module.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/error.h"

namespace ampkit::train {

// The scripted module as the host sees it. Its submodules' outputs cannot be observed from C++
// (a TorchScript module has no forward hooks to add at run time), so it has no hook points: the
// NaN locator names the first parameter whose gradient went non-finite instead.
class JitModuleView final : public ModelView {
 public:
  explicit JitModuleView(torch::jit::Module& module) : module_(module) {}
  NamedTensors named_parameters() const override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() const override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void train(bool on) override { module_.train(on); }
  std::vector<std::string> hook_points() const override { return {}; }
  std::string module_type(const std::string& path) const override {
    for (const auto& m : module_.named_modules())
      if (m.name == path) return m.value.type()->name() ? m.value.type()->name()->name() : "";
    return "";
  }

 private:
  torch::jit::Module& module_;
};

// `file`, loaded onto `device`; Error(data) naming it when it is not a TorchScript module.
torch::jit::Module load_module(const std::string& file, const at::Device& device);

// Arguments of forward besides self: (required, all).
std::pair<size_t, size_t> forward_arity(const torch::jit::Module& module);

// torch.jit.trace names the arguments of its submodules' forward argument_1, argument_2, ...
bool looks_traced(const torch::jit::Module& module);

// The model's own message for a failure inside forward or backward: TorchScript wraps it in its
// traceback; its last "Error: " line is what the failing op said.
std::string model_message(const std::exception& e);

// Error(data) when the output of forward on `where` (a batch) cannot carry the training loss's
// gradient to the parameters (an integer dtype, a detached tensor); nothing outside grad mode. It
// replaces autograd's "element 0 of tensors does not require grad" from the engine's backward.
void check_gradient(const at::Tensor& output, const std::string& where);
// Throws Error(data) where the model's output (or returned loss) is complex: a cast to a real
// dtype would drop the imaginary part with a LibTorch warning and train on the rest.
void check_real(const at::Tensor& output, const std::string& where);

// Anything `fn` (the model's forward, or the loss of its outputs) throws besides our own errors is
// the model's failure: one line with its own message.
template <typename Fn>
auto model_call(const std::string& where, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::data, "the model failed on " + where + ": " + model_message(e));
  }
}

// Whether autograd is inside the model's graph: a hook on each training loss (run after the
// engine's scaling, before any node of the model) sets it, a callback at the end of a backward that
// succeeded clears it. A failure that escapes a step while it is set came from the model's backward.
class BackwardWatch {
 public:
  void watch(const at::Tensor& loss);
  bool inside() const { return inside_->load(); }

 private:
  std::shared_ptr<std::atomic<bool>> inside_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace ampkit::train
