// Workload synthetic: an MLP of any width and depth learning a fixed random linear teacher.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "ampkit/autocast_guard.h"
#include "ampkit/forward_hook.h"
#include "config/option_builders.h"
#include "workloads/fp8_linear.h"
#include "workloads/registry.h"
#include "workloads/workload.h"

namespace F = torch::nn::functional;

namespace ampkit::train {

namespace {

// --synthetic-*: filled by the option table from synthetic_options() below.
struct SyntheticOptions {
  int64_t width = 0, depth = 0, inputs = 0, classes = 0;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t inputs, int64_t width, int64_t depth, int64_t classes) {
    int64_t in = inputs;
    for (int64_t i = 0; i < depth; ++i) {
      layers->push_back(torch::nn::Linear(in, width));
      in = width;
    }
    layers->push_back(torch::nn::Linear(in, classes));
    register_module("layers", layers);
    for (size_t i = 0; i < layers->size(); ++i) names_.push_back("layers." + std::to_string(i));
  }
  at::Tensor forward(at::Tensor x) {
    const size_t n = layers->size();
    for (size_t i = 0; i < n; ++i) {
      auto* linear = layers[i]->as<torch::nn::Linear>();
      x = tap(names_[i], x,
              fp8 != nullptr ? fp8->linear(static_cast<int64_t>(i), x, linear->weight, linear->bias)
                             : linear->forward(x));
      if (i + 1 < n) x = F::gelu(x);
    }
    return x;
  }
  torch::nn::ModuleList layers;
  std::vector<std::string> names_;  // hook points, "layers.<i>"
  std::unique_ptr<Fp8Linears> fp8;  // --fp8: layer i is the block's layer i
};

// Samples are generated, never stored: batch i of epoch e comes from a generator seeded with
// (seed, e, i), so any batch can be regenerated exactly (resume, NaN re-runs). Each micro-batch
// is such a batch of its own: with --accumulate K, a step sees K independently generated
// batches, not K slices of one large batch (the same in distribution, not in samples).
// Labels are computed in fp32 whatever --precision is (synthetic_labels).
class Synthetic final : public Workload {
 public:
  Synthetic(const TrainConfig& cfg, const at::Device& device)
      : cfg_(cfg),
        opts_(options::workload_values<SyntheticOptions>(cfg)),
        device_(device),
        model_(std::make_shared<MlpImpl>(opts_.inputs, opts_.width, opts_.depth, opts_.classes)),
        view_(*model_),
        slice_(rank_slice(cfg.batch_size, cfg.dist)) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(cfg.seed ^ 0x7e4c4e5ULL);
    teacher_ = at::randn({opts_.inputs, opts_.classes}, gen).to(device_);
    model_->to(device_);
  }
  ModelView& model() override { return view_; }
  // A nominal epoch of 1000 batches keeps --epochs meaningful for generated data.
  int64_t batches_per_epoch() const override { return 1000; }
  void start_epoch(int64_t epoch) override { epoch_ = epoch; }
  Fp8Linears* enable_fp8(Fp8Recipe& recipe, const std::string& name) override {
    model_->fp8 =
        std::make_unique<Fp8Linears>(recipe, name, static_cast<int64_t>(model_->layers->size()), device_);
    return model_->fp8.get();
  }
  at::Tensor loss(int64_t index) override {
    // The global batch of all ranks is generated, and each rank trains on its slice of it:
    // N ranks of batch B see exactly the samples of one rank of batch N*B.
    auto [x, y] =
        batch(cfg_.seed * 7919 + static_cast<uint64_t>(epoch_) * 1000003 + static_cast<uint64_t>(index),
              cfg_.dist.world_size);
    x = x.narrow(0, slice_.start, slice_.length);
    y = y.narrow(0, slice_.start, slice_.length);
    return F::cross_entropy(model_->forward(x).to(at::kFloat), y);
  }
  std::optional<Evaluation> evaluate(int64_t max_batches) override {
    torch::NoGradGuard no_grad;
    const int64_t batches = max_batches > 0 ? std::min<int64_t>(max_batches, 10) : 10;
    double loss_sum = 0, correct = 0, count = 0;
    for (int64_t b = 0; b < batches; ++b) {
      auto [x, y] = batch(0xE7A1ULL + cfg_.seed * 31 + static_cast<uint64_t>(b) + (1ULL << 40));
      const at::Tensor logits = model_->forward(x).to(at::kFloat);
      loss_sum +=
          F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
      correct += at::eq(logits.argmax(1), y).sum().item<double>();
      count += static_cast<double>(x.size(0));
    }
    return Evaluation{loss_sum / count, correct / count, std::nullopt};
  }

 private:
  std::pair<at::Tensor, at::Tensor> batch(uint64_t seed, int64_t ranks = 1) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor x = to_device(at::randn({cfg_.batch_size * ranks, opts_.inputs}, gen), device_);
    return {x, synthetic_labels(x, teacher_)};
  }
  TrainConfig cfg_;
  SyntheticOptions opts_;
  at::Device device_;
  std::shared_ptr<MlpImpl> model_;
  NnModuleView view_;
  RankSlice slice_;
  at::Tensor teacher_;
  int64_t epoch_ = 0;
};

}  // namespace

at::Tensor synthetic_labels(const at::Tensor& x, const at::Tensor& teacher) {
  // loss() runs under the trainer's autocast; the teacher's matmul would then run in bf16/fp16
  // and the labels would depend on --precision (0.4% of them in bf16). Labels are data.
  AutocastOffGuard fp32(x.device().type());
  return at::matmul(x, teacher).argmax(1);
}

std::unique_ptr<Workload> make_synthetic(const TrainConfig& cfg, const at::Device& device) {
  return std::make_unique<Synthetic>(cfg, device);
}

std::vector<HostOption> synthetic_options() {
  using namespace options;  // NOLINT: the table reads as declarations
  return {
      integer("synthetic-width", "256", "synthetic: hidden width of the MLP.",
              workload_field(&SyntheticOptions::width))
          .range(1, 65536)
          .shared_by_ranks(),
      integer("synthetic-depth", "4", "synthetic: number of hidden layers.",
              workload_field(&SyntheticOptions::depth))
          .range(0, 256)
          .shared_by_ranks(),
      integer("synthetic-inputs", "128", "synthetic: input features.",
              workload_field(&SyntheticOptions::inputs))
          .range(1, 65536)
          .shared_by_ranks(),
      integer("synthetic-classes", "10", "synthetic: output classes.",
              workload_field(&SyntheticOptions::classes))
          .range(2, 65536)
          .shared_by_ranks(),
  };
}

}  // namespace ampkit::train
