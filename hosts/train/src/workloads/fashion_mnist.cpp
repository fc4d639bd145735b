// Workload fashion-mnist: a 2-conv CNN on Fashion-MNIST read from the Debian package's IDX.gz files.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/forward_hook.h"
#include "config/option_builders.h"
#include "workloads/registry.h"
#include "workloads/workload.h"

namespace F = torch::nn::functional;

namespace ampkit::train {

namespace {

// --data-dir: filled by the option table from fashion_mnist_options() below.
struct FashionMnistOptions {
  std::string data_dir;
};

std::vector<uint8_t> read_gz(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file))
    throw Error(ErrorCategory::data, "Fashion-MNIST file " + file.string() +
                                         " is missing; install the Debian package dataset-fashion-mnist "
                                         "(tools/setup.sh does) or point --data-dir at the IDX .gz files");
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) throw Error(ErrorCategory::data, "cannot open " + file.string());
  std::vector<uint8_t> out;
  uint8_t buffer[1 << 16];
  int n = 0;
  while ((n = gzread(f, buffer, sizeof buffer)) > 0) out.insert(out.end(), buffer, buffer + n);
  const bool bad = n < 0;
  gzclose(f);
  if (bad) throw Error(ErrorCategory::data, file.string() + " is not a valid gzip file");
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) | b[at + 3];
}

// IDX format: magic 2051 (images: count, rows, cols, then bytes) or 2049 (labels: count, bytes).
at::Tensor read_images(const std::filesystem::path& file) {
  const auto b = read_gz(file);
  if (b.size() < 16 || be32(b, 0) != 2051)
    throw Error(ErrorCategory::data, file.string() + " is not an IDX image file");
  const int64_t n = be32(b, 4), rows = be32(b, 8), cols = be32(b, 12);
  if (rows != 28 || cols != 28 || b.size() != size_t(16 + n * rows * cols))
    throw Error(ErrorCategory::data, file.string() + " has an unexpected size (expected 28x28 images)");
  at::Tensor bytes = at::empty({n, 1, rows, cols}, at::kByte);
  std::memcpy(bytes.data_ptr(), b.data() + 16, size_t(n * rows * cols));
  // Normalised with the training set's mean and standard deviation.
  return (bytes.to(at::kFloat) / 255.0 - 0.2860) / 0.3530;
}

at::Tensor read_labels(const std::filesystem::path& file) {
  const auto b = read_gz(file);
  if (b.size() < 8 || be32(b, 0) != 2049)
    throw Error(ErrorCategory::data, file.string() + " is not an IDX label file");
  const int64_t n = be32(b, 4);
  if (b.size() != size_t(8 + n)) throw Error(ErrorCategory::data, file.string() + " is truncated");
  at::Tensor bytes = at::empty({n}, at::kByte);
  std::memcpy(bytes.data_ptr(), b.data() + 8, size_t(n));
  return bytes.to(at::kLong);
}

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = F::max_pool2d(F::relu(call("conv1", conv1, x)), F::MaxPool2dFuncOptions(2));
    h = F::max_pool2d(F::relu(call("conv2", conv2, h)), F::MaxPool2dFuncOptions(2));
    h = F::relu(call("fc1", fc1, h.flatten(1)));
    return call("fc2", fc2, h);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};

class FashionMnist final : public Workload {
 public:
  FashionMnist(const TrainConfig& cfg, const at::Device& device)
      : batch_size_(cfg.batch_size),
        ranks_(cfg.dist.world_size),
        slice_(rank_slice(cfg.batch_size, cfg.dist)),
        seed_(cfg.seed),
        device_(device),
        view_(*model_) {
    const std::string data_dir = options::workload_values<FashionMnistOptions>(cfg).data_dir;
    const std::filesystem::path dir = data_dir;
    train_x_ = read_images(dir / "train-images-idx3-ubyte.gz");
    train_y_ = read_labels(dir / "train-labels-idx1-ubyte.gz");
    test_x_ = read_images(dir / "t10k-images-idx3-ubyte.gz");
    test_y_ = read_labels(dir / "t10k-labels-idx1-ubyte.gz");
    if (train_x_.size(0) != train_y_.size(0) || test_x_.size(0) != test_y_.size(0))
      throw Error(ErrorCategory::data, "Fashion-MNIST image and label counts differ in " + data_dir);
    if (batch_size_ * ranks_ > train_x_.size(0))
      throw Error(ErrorCategory::usage, "--batch-size " + std::to_string(batch_size_) + " x " +
                                            std::to_string(ranks_) + " ranks exceeds the " +
                                            std::to_string(train_x_.size(0)) + " training images");
    model_->to(device_);
    order_ = at::arange(train_x_.size(0), at::kLong);
  }
  ModelView& model() override { return view_; }
  // A batch is global: rank r of N trains on its slice (rank_slice) of the next N*B images.
  int64_t batches_per_epoch() const override { return train_x_.size(0) / slice_.global; }
  void start_epoch(int64_t epoch) override {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003 + static_cast<uint64_t>(epoch));
    order_ = at::randperm(train_x_.size(0), gen, at::kLong);
  }
  at::Tensor loss(int64_t index) override {
    const at::Tensor idx = order_.narrow(0, index * slice_.global + slice_.start, slice_.length);
    const at::Tensor x = to_device(train_x_.index_select(0, idx), device_);
    const at::Tensor y = to_device(train_y_.index_select(0, idx), device_);
    return F::cross_entropy(model_->forward(x).to(at::kFloat), y);
  }
  std::optional<Evaluation> evaluate(int64_t max_batches) override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t n = test_x_.size(0), bs = 1000;
    int64_t batches = (n + bs - 1) / bs;
    if (max_batches > 0) batches = std::min(batches, max_batches);
    double loss_sum = 0, correct = 0, count = 0;
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t len = std::min(bs, n - b * bs);
      const at::Tensor x = to_device(test_x_.narrow(0, b * bs, len), device_);
      const at::Tensor y = to_device(test_y_.narrow(0, b * bs, len), device_);
      const at::Tensor logits = model_->forward(x).to(at::kFloat);
      loss_sum +=
          F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
      correct += at::eq(logits.argmax(1), y).sum().item<double>();
      count += static_cast<double>(len);
    }
    model_->train();
    return Evaluation{loss_sum / count, correct / count, std::nullopt};
  }

 private:
  int64_t batch_size_;
  int64_t ranks_;
  RankSlice slice_;
  uint64_t seed_;
  at::Device device_;
  std::shared_ptr<CnnImpl> model_ = std::make_shared<CnnImpl>();
  NnModuleView view_;
  at::Tensor train_x_, train_y_, test_x_, test_y_, order_;
};

}  // namespace

std::unique_ptr<Workload> make_fashion_mnist(const TrainConfig& cfg, const at::Device& device) {
  return std::make_unique<FashionMnist>(cfg, device);
}

std::vector<HostOption> fashion_mnist_options() {
  using namespace options;  // NOLINT: the table reads as declarations
  return {
      text("data-dir", "/usr/share/datasets/fashion-mnist",
           "Folder with the Fashion-MNIST IDX .gz files (Debian package dataset-fashion-mnist).",
           workload_field(&FashionMnistOptions::data_dir)),
  };
}

}  // namespace ampkit::train
