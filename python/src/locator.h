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
// backward. The layout is ampkit-train's nan-report JSON, the engine's (ampkit/nan_report.h):
// finish() gives the keys the re-run knows (nan_findings_json), report() the whole report with the
// step's (nan_report_json). `module_types`: every module's type name by path. Call one of them, once.
class LocatorSession : public torch::CustomClassHolder {
 public:
  LocatorSession();
  void observe(const std::string& module, std::optional<at::Tensor> input, at::Tensor output);
  c10::Dict<std::string, c10::IValue> finish(double loss, c10::Dict<std::string, std::string> module_types);
  c10::Dict<std::string, c10::IValue> report(double loss, c10::Dict<std::string, std::string> module_types,
                                             int64_t step, int64_t rank, std::string detection,
                                             std::string action, double loss_scale, std::string precision);

 private:
  // Ends the recording: what it found, and the type name of the module found ("" for none).
  NanLocation located(double loss, const c10::Dict<std::string, std::string>& module_types,
                      std::string& module_type);
  std::unique_ptr<LocatorRecording> recording_;
};

}  // namespace ampkit::python
