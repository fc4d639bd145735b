// Workload char-gpt: a small GPT (causal self-attention) over the bytes of the fortunes corpus.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampkit/error.h"
#include "ampkit/forward_hook.h"
#include "config/option_builders.h"
#include "workloads/fp8_linear.h"
#include "workloads/registry.h"
#include "workloads/workload.h"

namespace F = torch::nn::functional;
namespace fs = std::filesystem;

namespace ampkit::train {

namespace {

// --text-dir and --gpt-*: filled by the option table from char_gpt_options() below.
struct CharGptOptions {
  std::string text_dir;
  int64_t layers = 0, width = 0, heads = 0, context = 0;
};

constexpr int64_t kVocab = 256;  // bytes: no tokenizer, every corpus works

// A linear layer as Python's nn.Linear computes it: at::linear, which autocast runs as one addmm
// over the flattened sequence with the bias cast too. The C++ frontend's nn::Linear::forward
// multiplies, then adds the fp32 bias to the bf16/fp16 product in a second pass (F::linear for
// inputs of more than two dimensions), and its backward sums the bias's gradient in a third: about
// 4% of a 1-thread bf16 step, and not the math of bench/torch_reference.py's model.
// With --fp8 the same layer multiplies in fp8 (fp8_linear.h), as layer `fp8_index` of the block.
at::Tensor linear(const std::string& module, const torch::nn::Linear& m, const at::Tensor& x,
                  Fp8Linears* fp8 = nullptr, int64_t fp8_index = 0) {
  if (fp8 != nullptr) return tap(module, x, fp8->linear(fp8_index, x, m->weight, m->bias));
  return tap(module, x, at::linear(x, m->weight, m->bias));
}

// A block's four linear layers in the fp8 block, then the head's.
constexpr int64_t kFp8PerBlock = 4;

struct BlockImpl : torch::nn::Module {
  // `path` is the block's name in the model ("blocks.3"): the prefix of its hook points.
  BlockImpl(int64_t width, int64_t heads, const std::string& path)
      : heads_(heads),
        path_(path + "."),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc(register_module("fc", torch::nn::Linear(width, 4 * width))),
        out(register_module("out", torch::nn::Linear(4 * width, width))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = linear(path_ + "qkv", qkv, call(path_ + "ln1", ln1, x), fp8, fp8_first).split(C, 2);
    auto heads = [&](const at::Tensor& t) { return t.reshape({B, T, heads_, C / heads_}).transpose(1, 2); };
    at::Tensor y =
        at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), {}, 0.0,
                                         /*is_causal=*/true);
    at::Tensor h =
        x + linear(path_ + "proj", proj, y.transpose(1, 2).contiguous().view({B, T, C}), fp8, fp8_first + 1);
    const at::Tensor hidden =
        F::gelu(linear(path_ + "fc", fc, call(path_ + "ln2", ln2, h), fp8, fp8_first + 2));
    return h + linear(path_ + "out", out, hidden, fp8, fp8_first + 3);
  }
  int64_t heads_;
  std::string path_;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
  Fp8Linears* fp8 = nullptr;  // --fp8: the model's fp8 block, this block's layers from fp8_first
  int64_t fp8_first = 0;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl(int64_t layers, int64_t width, int64_t heads, int64_t context)
      : tokens(register_module("tokens", torch::nn::Embedding(kVocab, width))),
        positions(register_module("positions", torch::nn::Embedding(context, width))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        head(register_module("head", torch::nn::Linear(width, kVocab))) {
    for (int64_t i = 0; i < layers; ++i)
      blocks->push_back(Block(width, heads, "blocks." + std::to_string(i)));
    register_module("blocks", blocks);
  }
  at::Tensor forward(const at::Tensor& idx) {
    const int64_t T = idx.size(1);
    at::Tensor x = call("tokens", tokens, idx) + call("positions", positions, at::arange(T, idx.options()));
    for (const auto& b : *blocks) x = b->as<BlockImpl>()->forward(x);
    return linear("head", head, call("ln", ln, x), fp8.get(),
                  kFp8PerBlock * static_cast<int64_t>(blocks->size()));
  }
  // Every linear layer through one fp8 block (the head last).
  Fp8Linears& enable_fp8(Fp8Recipe& recipe, const std::string& name, const at::Device& device) {
    const auto n = static_cast<int64_t>(blocks->size());
    fp8 = std::make_unique<Fp8Linears>(recipe, name, kFp8PerBlock * n + 1, device);
    for (int64_t i = 0; i < n; ++i) {
      auto* b = (*blocks)[i]->as<BlockImpl>();
      b->fp8 = fp8.get();
      b->fp8_first = kFp8PerBlock * i;
    }
    return *fp8;
  }
  torch::nn::Embedding tokens, positions;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
  std::unique_ptr<Fp8Linears> fp8;
};

at::Tensor read_corpus(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCategory::data,
                "text folder " + dir.string() +
                    " is missing; install the Debian package fortunes (tools/setup.sh does) "
                    "or point --text-dir at a folder of text files");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && !e.is_symlink() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    text += s.str();
  }
  if (text.size() < 10000)
    throw Error(ErrorCategory::data, "text folder " + dir.string() + " holds only " +
                                         std::to_string(text.size()) +
                                         " bytes of text; char-gpt needs at least 10000");
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  return bytes.to(at::kLong);
}

// Training windows are drawn at random offsets from the first 90% of the corpus; the last 10%
// is held out. Batch i of epoch e comes from a generator seeded with (seed, e, i).
class CharGpt final : public Workload {
 public:
  CharGpt(const TrainConfig& cfg, const at::Device& device)
      : cfg_(cfg),
        opts_(options::workload_values<CharGptOptions>(cfg)),
        device_(device),
        model_(std::make_shared<GptImpl>(opts_.layers, opts_.width, opts_.heads, opts_.context)),
        view_(*model_),
        slice_(rank_slice(cfg.batch_size, cfg.dist)) {
    const at::Tensor corpus = read_corpus(opts_.text_dir);
    const int64_t split = corpus.size(0) * 9 / 10;
    train_ = corpus.narrow(0, 0, split);
    test_ = corpus.narrow(0, split, corpus.size(0) - split);
    model_->to(device_);
  }
  ModelView& model() override { return view_; }
  int64_t batches_per_epoch() const override {
    return std::max<int64_t>(1, train_.size(0) / (slice_.global * opts_.context));
  }
  void start_epoch(int64_t epoch) override { epoch_ = epoch; }
  Fp8Linears* enable_fp8(Fp8Recipe& recipe, const std::string& name) override {
    return &model_->enable_fp8(recipe, name, device_);
  }
  at::Tensor loss(int64_t index) override {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        cfg_.seed * 7919 + static_cast<uint64_t>(epoch_) * 1000003 + static_cast<uint64_t>(index));
    // The global batch of all ranks is drawn, and each rank trains on its slice of it.
    const at::Tensor offsets =
        at::randint(train_.size(0) - opts_.context - 1, {slice_.global}, gen, at::kLong)
            .narrow(0, slice_.start, slice_.length);
    return window_loss(train_, offsets);
  }
  std::optional<Evaluation> evaluate(int64_t max_batches) override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t T = opts_.context, stride = T * cfg_.batch_size;
    int64_t batches = std::max<int64_t>(1, (test_.size(0) - 1) / stride);
    if (max_batches > 0) batches = std::min(batches, max_batches);
    double loss_sum = 0, correct = 0, count = 0;
    for (int64_t b = 0; b < batches; ++b) {
      const at::Tensor offsets =
          at::arange(b * stride, (b + 1) * stride, T, at::kLong).clamp_max(test_.size(0) - T - 1);
      auto [x, y] = windows(test_, offsets);
      const at::Tensor logits = model_->forward(x).to(at::kFloat).view({-1, kVocab});
      const at::Tensor targets = y.reshape({-1});
      loss_sum += F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      correct += at::eq(logits.argmax(1), targets).sum().item<double>();
      count += static_cast<double>(targets.numel());
    }
    model_->train();
    Evaluation e{loss_sum / count, correct / count, std::nullopt};
    e.perplexity = std::exp(e.loss);
    return e;
  }

 private:
  std::pair<at::Tensor, at::Tensor> windows(const at::Tensor& data, const at::Tensor& offsets) {
    const at::Tensor index = offsets.unsqueeze(1) + at::arange(opts_.context + 1, at::kLong).unsqueeze(0);
    const at::Tensor w = data.index({index});
    return {to_device(w.narrow(1, 0, opts_.context), device_),
            to_device(w.narrow(1, 1, opts_.context), device_)};
  }
  at::Tensor window_loss(const at::Tensor& data, const at::Tensor& offsets) {
    auto [x, y] = windows(data, offsets);
    return F::cross_entropy(model_->forward(x).to(at::kFloat).view({-1, kVocab}), y.reshape({-1}));
  }
  TrainConfig cfg_;
  CharGptOptions opts_;
  at::Device device_;
  std::shared_ptr<GptImpl> model_;
  NnModuleView view_;
  RankSlice slice_;
  at::Tensor train_, test_;
  int64_t epoch_ = 0;
};

}  // namespace

std::unique_ptr<Workload> make_char_gpt(const TrainConfig& cfg, const at::Device& device) {
  return std::make_unique<CharGpt>(cfg, device);
}

std::vector<HostOption> char_gpt_options() {
  using namespace options;  // NOLINT: the table reads as declarations
  return {
      text("text-dir", "/usr/share/games/fortunes",
           "char-gpt: folder of text files (Debian package fortunes); all files except *.dat and *.u8 are "
           "read.",
           workload_field(&CharGptOptions::text_dir)),
      integer("gpt-layers", "2", "char-gpt: transformer blocks.", workload_field(&CharGptOptions::layers))
          .range(1, 64)
          .shared_by_ranks(),
      integer("gpt-width", "128", "char-gpt: embedding width (a multiple of --gpt-heads).",
              workload_field(&CharGptOptions::width))
          .range(1, 8192)
          .shared_by_ranks(),
      integer("gpt-heads", "4", "char-gpt: attention heads.", workload_field(&CharGptOptions::heads))
          .range(1, 64)
          .shared_by_ranks(),
      integer("gpt-context", "64", "char-gpt: context length in bytes.",
              workload_field(&CharGptOptions::context))
          .range(2, 4096)
          .shared_by_ranks(),
  };
}

void check_char_gpt_options(const TrainConfig& cfg) {
  const CharGptOptions o = options::workload_values<CharGptOptions>(cfg);
  if (o.width % o.heads != 0)
    throw Error(ErrorCategory::usage, "--gpt-width must be a multiple of --gpt-heads (" +
                                          std::to_string(o.heads) + "), got " + std::to_string(o.width));
}

}  // namespace ampkit::train
