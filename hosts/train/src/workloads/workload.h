// A reference workload: a model, its training batches, its loss and (optionally) a test metric.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/fp8_recipe.h>
#include <ampkit/model_view.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "ampkit/error.h"
#include "config/train_config.h"

namespace ampkit::train {

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
  std::optional<double> perplexity;  // language models: exp(loss)
};

class Fp8Linears;

class Workload {
 public:
  virtual ~Workload() = default;
  // The model, seen through the view the host and the engine use (model_view.h).
  virtual ModelView& model() = 0;
  // Training micro-batches of `batch_size` samples in one epoch.
  virtual int64_t batches_per_epoch() const = 0;
  // Reorders the training set for `epoch` (deterministic in the seed and the epoch).
  virtual void start_epoch(int64_t epoch) = 0;
  // fp32 loss of training micro-batch `index` of the current epoch; runs under autocast.
  virtual at::Tensor loss(int64_t index) = 0;
  // Loss and accuracy on held-out data (at most `max_batches`, 0 = all), in eval mode, fp32.
  virtual std::optional<Evaluation> evaluate(int64_t max_batches) = 0;
  // Routes the model's linear layers through fp8 casts scaled by `recipe` (fp8_linear.h), all in
  // one block the caller updates once per step; nullptr where the model has no such layers.
  virtual Fp8Linears* enable_fp8(Fp8Recipe& /*recipe*/, const std::string& /*name*/) { return nullptr; }
  // A failure that escaped a training step (not an ampkit::Error, not c10d's): the workload's own
  // error for it where its model is to blame (a user's model failing in backward), otherwise
  // nothing, and the failure is reported as it is.
  virtual std::optional<Error> model_failure(const std::exception& /*failure*/) const { return std::nullopt; }
};

std::unique_ptr<Workload> make_fashion_mnist(const TrainConfig& cfg, const at::Device& device);
std::unique_ptr<Workload> make_char_gpt(const TrainConfig& cfg, const at::Device& device);
std::unique_ptr<Workload> make_synthetic(const TrainConfig& cfg, const at::Device& device);
std::unique_ptr<Workload> make_torchscript(const TrainConfig& cfg, const at::Device& device);

// Rank slicing, written once: rank r of N trains on samples [r*B, (r+1)*B) of every global batch
// of N*B samples (B per rank), so N ranks of batch B see exactly one rank of batch N*B's samples.
struct RankSlice {
  int64_t start = 0;   // of this rank's samples within the global batch
  int64_t length = 0;  // B
  int64_t global = 0;  // N*B
};
inline RankSlice rank_slice(int64_t per_rank, const DistributedConfig& dist) {
  return {per_rank * dist.rank, per_rank, per_rank * dist.world_size};
}

// A CPU batch on `device`: unchanged on the CPU; on CUDA through pinned memory with a
// non-blocking copy, as PyTorch's pin_memory=True loaders do (batch_copy.cpp).
at::Tensor to_device(const at::Tensor& batch, const at::Device& device);

// The synthetic workload's labels, argmax(x @ teacher), always in fp32 (autocast off): the
// training data must not depend on --precision.
at::Tensor synthetic_labels(const at::Tensor& x, const at::Tensor& teacher);

}  // namespace ampkit::train
