// The NaN locator for Python modules: forward hooks tap each module into the engine's locator.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

#include <memory>
#include <optional>
#include <string>

#include "ampkit/nan_locator.h"

namespace ampkit::python {

// One re-run of a bad step (ampkit.NanLocator.locate): created before the forward, fed every
// module's output by the forward hooks (observe), finished with the loss after the scaled
// backward. The report has the keys of ampkit-train's nan-report JSON that the re-run knows:
// located, module, phase, finding, micro_batch, micro_batch_loss, observation, forward, backward.
class LocatorSession : public torch::CustomClassHolder {
 public:
  LocatorSession();
  void observe(const std::string& module, std::optional<at::Tensor> input, at::Tensor output);
  c10::Dict<std::string, c10::IValue> finish(double loss);

 private:
  std::unique_ptr<LocatorRecording> recording_;
};

}  // namespace ampkit::python
