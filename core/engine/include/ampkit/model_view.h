// What the host and the engine need of a model, whatever defines it: a torch::nn::Module built in
// C++, or a TorchScript module a user saved from Python (hosts/train's torchscript workload).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace ampkit {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class ModelView {
 public:
  virtual ~ModelView() = default;
  // Parameters and buffers by their state_dict names ("layers.0.weight"), in registration order.
  virtual NamedTensors named_parameters() const = 0;
  virtual NamedTensors named_buffers() const = 0;
  // Training mode (dropout on, batch norm statistics updated) or evaluation mode, recursively.
  virtual void train(bool on) = 0;
  // The modules whose outputs the model reports through tap() (forward_hook.h): --inject's layer names
  // and the NaN locator's; empty when the model cannot report any (a TorchScript module).
  virtual std::vector<std::string> hook_points() const = 0;
  // The type of the submodule at `path` ("Linear", "Conv2d"), for reports; "" when unknown.
  virtual std::string module_type(const std::string& path) const = 0;
};

// A torch::nn::Module (the built-in workloads): its leaf modules are its hook points.
class NnModuleView final : public ModelView {
 public:
  explicit NnModuleView(torch::nn::Module& module) : module_(module) {}
  NamedTensors named_parameters() const override;
  NamedTensors named_buffers() const override;
  void train(bool on) override;
  std::vector<std::string> hook_points() const override;
  std::string module_type(const std::string& path) const override;

 private:
  torch::nn::Module& module_;
};

}  // namespace ampkit
