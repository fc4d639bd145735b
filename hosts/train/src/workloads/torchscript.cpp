// Workload torchscript: the user's own model (torch.jit.script(m).save) on tensors python saved
// with torch.save({"inputs": X, "targets": Y}) (docs/your-own-model.md).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/nn/functional/loss.h>
#include <torch/script.h>

#include <algorithm>

#include "ampkit/error.h"
#include "config/option_builders.h"
#include "workloads/registry.h"
#include "workloads/torchscript_data.h"
#include "workloads/torchscript_module.h"
#include "workloads/workload.h"

namespace F = torch::nn::functional;

namespace ampkit::train {

namespace {

// --model, --data, --test-data, --loss, --data-order: filled by the option table from
// torchscript_options() below.
struct TorchScriptOptions {
  std::string model_file;      // the module torch.jit.script(m).save wrote
  std::string data_path;       // torch.save({"inputs": X, "targets": Y}), or a folder of them
  std::string test_data_path;  // the same for evaluation; empty: none
  std::string loss;            // cross_entropy | mse | returned
  std::string data_order;      // shuffled | file
};

class TorchScript final : public Workload {
 public:
  TorchScript(const TrainConfig& cfg, const at::Device& device)
      : cfg_(cfg),
        opts_(options::workload_values<TorchScriptOptions>(cfg)),
        device_(device),
        module_(load_module(opts_.model_file, device)),
        view_(module_) {
    // Eager autocast and the profiling executor's fusions do not mix (fused kernels may keep
    // another dtype); the plain interpreter runs the graph op by op, as eager PyTorch does.
    torch::jit::setGraphExecutorOptimize(false);
    check_arity();
    check_trainable();
    if (looks_traced(module_))
      std::fprintf(
          stderr,
          "ampkit-train: warning: --model %s looks traced (torch.jit.trace): it keeps the train/eval "
          "mode it was traced in (dropout, batch norm); save torch.jit.script(model) instead\n",
          opts_.model_file.c_str());
    read_data();
    order_ = at::arange(train_.size(), at::kLong);
    module_.train(true);
  }
  ModelView& model() override { return view_; }
  int64_t batches_per_epoch() const override { return train_.size() / slice_.global; }
  void start_epoch(int64_t epoch) override {
    if (opts_.data_order == "file") return;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(cfg_.seed * 1000003 + static_cast<uint64_t>(epoch));
    order_ = at::randperm(train_.size(), gen, at::kLong);
  }
  at::Tensor loss(int64_t index) override {
    const at::Tensor idx = order_.narrow(0, index * slice_.global + slice_.start, slice_.length);
    last_batch_ = index;
    at::Tensor loss =
        batch_loss(to_device(train_.inputs.index_select(0, idx), device_),
                   to_device(train_.targets.index_select(0, idx), device_), "batch " + std::to_string(index));
    if (loss.requires_grad()) backward_.watch(loss);
    return loss;
  }
  std::optional<Evaluation> evaluate(int64_t max_batches) override;
  std::optional<Error> model_failure(const std::exception& e) const override {
    if (!backward_.inside()) return std::nullopt;
    return Error(ErrorCategory::data, "the model failed in backward on batch " + std::to_string(last_batch_) +
                                          ": " + model_message(e));
  }

 private:
  void check_arity() const {
    const auto [required, all] = forward_arity(module_);
    const size_t want = opts_.loss == "returned" ? 2 : 1;
    if (required <= want && want <= all) return;
    throw Error(ErrorCategory::usage,
                "--loss " + opts_.loss + " calls forward(" + (want == 2 ? "inputs, targets" : "inputs") +
                    "), but the module's forward takes " + std::to_string(required) +
                    (required == all ? "" : " to " + std::to_string(all)) + " argument(s)" +
                    (want == 1 ? "; a forward(inputs, targets) that returns the loss needs --loss returned"
                               : "; a forward(inputs) needs --loss cross_entropy or mse"));
  }
  void check_trainable() const {
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      if (p.value.requires_grad()) return;
    throw Error(ErrorCategory::data, "--model " + opts_.model_file +
                                         " has no parameter that requires grad: there is nothing to train");
  }
  // Every file up front, with the same rules; the class range waits for the model's first output.
  void read_data() {
    train_ = read_tensor_data(opts_.data_path, "--data");
    check_target_dtype(train_, opts_.loss, "--data");
    check_some_target(train_, "--data", "train on");
    if (train_.size() < slice_.global)
      throw Error(ErrorCategory::usage, "--data holds " + std::to_string(train_.size()) +
                                            " samples, fewer than one batch of --batch-size " +
                                            std::to_string(cfg_.batch_size) + " x " +
                                            std::to_string(cfg_.dist.world_size) + " rank(s)");
    if (opts_.test_data_path.empty()) return;
    test_ = read_tensor_data(opts_.test_data_path, "--test-data");
    check_target_dtype(*test_, opts_.loss, "--test-data");
    if (test_->size() == 0)
      throw Error(ErrorCategory::usage,
                  "--test-data holds 0 samples: there is nothing to evaluate (leave "
                  "--test-data out to train without evaluation)");
    check_some_target(*test_, "--test-data", "evaluate");
    const int64_t evaluated = cfg_.eval_batches * cfg_.batch_size;  // the test samples --eval-batches reads
    if (cfg_.eval_batches > 0 && evaluated < test_->size())
      check_some_target(
          {test_->inputs.narrow(0, 0, evaluated), test_->targets.narrow(0, 0, evaluated)}, "--test-data",
          "evaluate in the " + std::to_string(cfg_.eval_batches) + " batch(es) of --eval-batches");
  }
  // Class-index targets of which none counts (every one -100, or no position at all: [N, 0]) give
  // a loss of 0/0: refused for both files, as an empty file is.
  void check_some_target(const TensorData& d, const std::string& option, const std::string& use) const {
    if (opts_.loss != "cross_entropy" || !at::isIntegralType(d.targets.scalar_type(), false) ||
        d.size() == 0 || (d.targets != kIgnoredClass).any().item<bool>())
      return;
    throw Error(
        ErrorCategory::usage,
        option + " holds no target to " + use + ": " +
            (d.targets.numel() == 0 ? "its targets " + c10::str(d.targets.sizes()) + " hold no position"
                                    : std::string("every one is -100, which cross entropy ignores")));
  }
  // Class-index targets of every file against the model's classes, known from its first output
  // (the size of its class dimension, last): before the first step, and before any evaluation.
  void check_classes(const at::Tensor& out) {
    if (classes_checked_ || opts_.loss != "cross_entropy") return;
    classes_checked_ = true;
    // Targets of another layout than [N, ..., C] against [N, ...] get cross_entropy's own error.
    const auto fits = [&](const TensorData& d) { return out.dim() >= 2 && out.dim() == d.targets.dim() + 1; };
    if (fits(train_)) check_class_range(train_, out.size(-1), "--data");
    if (test_ && fits(*test_)) check_class_range(*test_, out.size(-1), "--test-data");
  }
  at::Tensor outputs_loss(const at::Tensor& out, const at::Tensor& y, bool sum) const;
  at::Tensor batch_loss(const at::Tensor& x, const at::Tensor& y, const std::string& where);
  at::Tensor forward_output(const at::Tensor& x, const std::string& where);

  TrainConfig cfg_;
  TorchScriptOptions opts_;
  at::Device device_;
  torch::jit::Module module_;
  JitModuleView view_;
  RankSlice slice_ = rank_slice(cfg_.batch_size, cfg_.dist);
  TensorData train_;
  std::optional<TensorData> test_;
  at::Tensor order_;
  bool classes_checked_ = false;
  BackwardWatch backward_;
  int64_t last_batch_ = 0;
};

// The loss of the module's outputs, in fp32. Cross entropy takes the class dimension last
// ([N, C], or [N, T, C] against [N, T] targets, as language models output it).
at::Tensor TorchScript::outputs_loss(const at::Tensor& out_any, const at::Tensor& y, bool sum) const {
  const at::Tensor out = out_any.to(at::kFloat);
  if (opts_.loss == "mse") {
    // Broadcasting an [N, 1] output against [N] targets would compare every output with every
    // target (torch only warns): the shapes must agree.
    if (out.sizes() != y.sizes())
      throw Error(ErrorCategory::data, "--loss mse: the model's output is " + c10::str(out.sizes()) +
                                           " and the targets are " + c10::str(y.sizes()) +
                                           "; mse compares them element by element, so their shapes must "
                                           "be the same");
    F::MSELossFuncOptions mse;  // the mean by default
    if (sum) mse.reduction(torch::kSum);
    return F::mse_loss(out, y.to(at::kFloat), mse);
  }
  F::CrossEntropyFuncOptions reduction;
  if (sum) reduction.reduction(torch::kSum);
  if (at::isIntegralType(y.scalar_type(), false) && out.dim() == y.dim() + 1 && out.dim() > 2)
    return F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}).to(at::kLong), reduction);
  // Probabilities of [N, T, C] against [N, T, C]: the class dimension is the last one here too
  // (torch's cross_entropy would take dimension 1, T, as the classes).
  if (at::isFloatingType(y.scalar_type()) && out.dim() > 2 && out.sizes() == y.sizes())
    return F::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1, y.size(-1)}).to(at::kFloat),
                            reduction);
  return F::cross_entropy(
      out, at::isIntegralType(y.scalar_type(), false) ? y.to(at::kLong) : y.to(at::kFloat), reduction);
}

// forward(inputs)'s output, a tensor whose class targets are in range (check_classes).
at::Tensor TorchScript::forward_output(const at::Tensor& x, const std::string& where) {
  const c10::IValue out = model_call(where, [&] { return module_.forward({x}); });
  if (!out.isTensor())
    throw Error(
        ErrorCategory::data,
        "--loss " + opts_.loss + ": the module's forward(inputs) must return a tensor, got " + out.tagKind());
  check_real(out.toTensor(), where);
  check_classes(out.toTensor());
  return out.toTensor();
}

at::Tensor TorchScript::batch_loss(const at::Tensor& x, const at::Tensor& y, const std::string& where) {
  if (opts_.loss == "returned") {
    const c10::IValue r = model_call(where, [&] { return module_.forward({x, y}); });
    if (!r.isTensor() || r.toTensor().numel() != 1)
      throw Error(ErrorCategory::data,
                  "--loss returned: the module's forward(inputs, targets) must return the "
                  "loss as a one-element tensor, got " +
                      r.tagKind());
    check_real(r.toTensor(), where);
    check_gradient(r.toTensor(), where);
    return model_call(where, [&] { return r.toTensor().reshape({}).to(at::kFloat); });
  }
  const at::Tensor out = forward_output(x, where);
  check_gradient(out, where);
  return model_call(where, [&] { return outputs_loss(out, y, false); });
}

// Loss over every sample (element-wise losses summed, divided by their count: the mean over
// samples, or over tokens for sequences), and accuracy where the targets are class indices.
std::optional<Evaluation> TorchScript::evaluate(int64_t max_batches) {
  if (!test_) return std::nullopt;
  torch::NoGradGuard no_grad;
  module_.train(false);
  const int64_t n = test_->size(), bs = cfg_.batch_size;
  int64_t batches = (n + bs - 1) / bs;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  const bool classes =
      opts_.loss == "cross_entropy" && at::isIntegralType(test_->targets.scalar_type(), false);
  double loss_sum = 0, correct = 0, count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t len = std::min(bs, n - b * bs);
    const at::Tensor x = to_device(test_->inputs.narrow(0, b * bs, len), device_);
    const at::Tensor y = to_device(test_->targets.narrow(0, b * bs, len), device_);
    const std::string where = "--test-data batch " + std::to_string(b);
    if (opts_.loss == "returned") {
      loss_sum += batch_loss(x, y, where).item<double>() * static_cast<double>(len);
      count += static_cast<double>(len);
      continue;
    }
    const at::Tensor out = forward_output(x, where).to(at::kFloat);
    loss_sum += model_call(where, [&] { return outputs_loss(out, y, true).item<double>(); });
    if (!classes) {  // mse: every element; probabilities: every position ([N, C]: sample, [N, T, C]: token)
      count += opts_.loss == "mse" ? static_cast<double>(out.numel())
               : out.dim() > 2     ? static_cast<double>(out.numel() / std::max<int64_t>(out.size(-1), 1))
                                   : static_cast<double>(len);
      continue;
    }
    const at::Tensor counted = y != kIgnoredClass;  // ignored targets count in neither mean
    count += counted.sum().item<double>();
    correct += model_call(where, [&] {
      return at::logical_and(at::eq(out.argmax(-1), y.to(at::kLong)), counted).sum().item<double>();
    });
  }
  module_.train(true);
  return Evaluation{loss_sum / count, classes ? correct / count : 0.0, std::nullopt};
}

}  // namespace

std::vector<HostOption> torchscript_options() {
  using namespace options;  // NOLINT: the table reads as declarations
  return {
      text(
          "model", "",
          "torchscript: the model, a file torch.jit.script(model).save(FILE) wrote (docs/your-own-model.md).",
          workload_field(&TorchScriptOptions::model_file)),
      text("data", "",
           "torchscript: training data, a file torch.save({\"inputs\": X, \"targets\": Y}) wrote, or a "
           "folder of "
           "such *.pt shards (concatenated in name order). Read without running pickled code.",
           workload_field(&TorchScriptOptions::data_path)),
      text("test-data", "", "torchscript: evaluation data in the same form; empty: no evaluation.",
           workload_field(&TorchScriptOptions::test_data_path)),
      text(
          "loss", "cross_entropy",
          "torchscript: cross_entropy (on forward(inputs), class dimension last, targets class indices or "
          "probabilities) | mse (on forward(inputs)) | returned (forward(inputs, targets) returns the loss). "
          "Computed in fp32.",
          workload_field(&TorchScriptOptions::loss))
          .one_of({"cross_entropy", "mse", "returned"})
          .shared_by_ranks(),
      text("data-order", "shuffled",
           "torchscript: shuffled (a seeded permutation per epoch) | file (batch i is samples i*B..(i+1)*B-1 "
           "in "
           "file order, to compare step for step with another trainer).",
           workload_field(&TorchScriptOptions::data_order))
          .one_of({"shuffled", "file"})
          .shared_by_ranks(),
  };
}

std::unique_ptr<Workload> make_torchscript(const TrainConfig& cfg, const at::Device& device) {
  const TorchScriptOptions o = options::workload_values<TorchScriptOptions>(cfg);
  if (o.model_file.empty()) throw Error(ErrorCategory::usage, "--workload torchscript needs --model FILE");
  if (o.data_path.empty()) throw Error(ErrorCategory::usage, "--workload torchscript needs --data FILE|DIR");
  return std::make_unique<TorchScript>(cfg, device);
}

}  // namespace ampkit::train
