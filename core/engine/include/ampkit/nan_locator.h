// The NaN locator: re-runs a bad step's micro-batches with a hook on every module and names
// the first module whose output or gradient went non-finite (or, for a spike, blew up).
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/step.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ampkit {

struct TensorSummary {
  std::string dtype;
  std::vector<int64_t> shape;
  double min = 0, max = 0, absmax = 0;  // over the finite elements
  int64_t nonfinite = 0;                // NaN and inf elements
};

// One module's input and output (phase "forward"), or the gradient of its output ("backward":
// `value` is the gradient, `input` unset).
struct ModuleObservation {
  std::string module;
  std::string phase;
  TensorSummary value;
  TensorSummary input;
};

struct NanLocation {
  bool found = false;
  // A model that reports no module outputs (a TorchScript module): the first parameter whose
  // gradient went non-finite, in backward order (phase "parameter", module ""); "" otherwise.
  std::string parameter;
  int micro_batch = 0;
  double loss = 0;      // of the micro-batch, as re-run (fp32, unscaled)
  std::string module;   // "" for the loss itself
  std::string phase;    // forward | backward | loss
  std::string finding;  // one line
  ModuleObservation observation;
  double reference_absmax = 0;                       // spikes: the same module (or |loss|) on a healthy batch
  std::vector<ModuleObservation> forward, backward;  // the reported micro-batch, in execution order
};

struct LocatorInputs {
  // The bad step's micro-batch losses, exactly as the step ran them (injected faults included).
  std::function<at::Tensor(int)> forward;
  int micro_batches = 1;
  // A healthy batch's loss with the same parameters, for spikes; may be empty.
  std::function<at::Tensor()> reference;
  Precision precision = Precision::fp32;
  double scale = 1.0;  // the loss scale of the bad step (overflow reproduces only at that scale)
  int accumulation_steps = 1;
  double spike_ratio = 10;  // a module whose |output| max grows by more than this vs the reference
  // Names of `parameters`, given for a model without hook points: their gradients are observed
  // in the re-run instead (empty: not observed).
  std::vector<std::string> parameter_names;
};

// Runs forward and scaled backward of each micro-batch under autocast with every module
// observed, and leaves `parameters`' gradients undefined afterwards. Non-finite findings win
// over spikes; forward (the first bad output in execution order) over backward (the first bad
// gradient in backward order, i.e. nearest the loss).
NanLocation locate_fault(const LocatorInputs& inputs, const std::vector<at::Tensor>& parameters);

// The same re-run driven by a caller that runs the model itself (the Python package, whose forward
// hooks call tap()): from construction on, every output tapped on this thread is observed, and the
// gradient of each through a hook. finish() judges the re-run as locate_fault judges one
// micro-batch (without the comparison with a healthy batch): the first non-finite output, else a
// non-finite loss, else the first non-finite output gradient in backward order.
class LocatorRecording {
 public:
  LocatorRecording();
  ~LocatorRecording();
  LocatorRecording(const LocatorRecording&) = delete;
  LocatorRecording& operator=(const LocatorRecording&) = delete;
  // Stops observing; `loss` is the re-run's loss (fp32, unscaled).
  NanLocation finish(double loss);

 private:
  struct Recording;
  std::unique_ptr<Recording> recording_;
};

}  // namespace ampkit
