// Fuzz target: a checkpoint's optimizer.pt, under a manifest that vouches for it (a hand-made or
// hostile checkpoint): restore_optimizer scans it against our bounds, then LibTorch's own reader
// (torch::serialize::InputArchive) loads it into the optimizer. The first byte picks the optimizer
// ampkit-train would have built: 'a' AdamW (--optimizer adamw), anything else SGD with momentum
// (--optimizer sgd); the rest is the file.
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "ampkit/checkpoint.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ampkit::LoadedCheckpoint checkpoint;
  checkpoint.folder = ampkit::fuzz::scratch() / "step-00000002";
  checkpoint.optimizer_bytes.assign(data + 1, data + size);
  std::vector<torch::Tensor> params = {torch::zeros({3, 2}).requires_grad_(),
                                       torch::zeros({2}).requires_grad_()};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (data[0] == 'a')
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
  else
    optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  ampkit::fuzz::refuse_only_with_error([&] { ampkit::restore_optimizer(checkpoint, *optimizer); });
  return 0;
}
