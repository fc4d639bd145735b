// libampkit inside your own LibTorch program: your model, your data, your loop; ampkit supplies
// the AMP step (scaling, one statistics pass, NaN policy, fused unscale+clip) with strategies
// chosen by name at run time, exactly as ampkit-train chooses them.
//
//   embed_trainer [--steps N] [--precision fp32|bf16|fp16] [--scaler NAME] [--clipper NAME]
//                 [--nan-policy NAME] [--comm NAME] [--opt KIND.OPTION=VALUE]... [--metrics FILE]
#include <ampkit/kinds.h>
#include <ampkit/metrics.h>
#include <ampkit/outcome_record.h>
#include <ampkit/plugin_options.h>
#include <ampkit/registry.h>
#include <ampkit/strategy_set.h>
#include <ampkit/trainer.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The user's own model: nothing ampkit-specific in it.
struct RegressorImpl : torch::nn::Module {
  RegressorImpl()
      : hidden(register_module("hidden", torch::nn::Linear(8, 32))),
        out(register_module("out", torch::nn::Linear(32, 1))) {}
  at::Tensor forward(const at::Tensor& x) {
    return out->forward(torch::nn::functional::silu(hidden->forward(x)));
  }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Regressor);

struct Arguments {
  int64_t steps = 50;
  std::string precision = "bf16";
  std::map<std::string, std::string> plugins = {
      {"scaler", "none"}, {"clipper", "norm"}, {"nan_policy", "skip"}, {"comm", "local"}};
  std::map<std::string, std::map<std::string, std::string>> options;  // kind -> option -> value
  std::string metrics = "embed_metrics.jsonl";
};

Arguments parse(int argc, char** argv) {
  Arguments a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--steps") {
      a.steps = std::stoll(value);
    } else if (flag == "--precision") {
      a.precision = value;
    } else if (flag == "--metrics") {
      a.metrics = value;
    } else if (flag == "--opt") {  // KIND.OPTION=VALUE, as ampkit-train takes it
      const auto dot = value.find('.'), eq = value.find('=');
      if (dot == std::string::npos || eq == std::string::npos || eq < dot)
        throw std::invalid_argument("--opt takes KIND.OPTION=VALUE, got " + value);
      a.options[value.substr(0, dot)][value.substr(dot + 1, eq - dot - 1)] = value.substr(eq + 1);
    } else {
      const ampkit::KindInfo* kind = nullptr;  // --scaler, --clipper, --nan-policy, --comm
      for (const ampkit::KindInfo& k : ampkit::kKinds) {
        std::string selector = std::string("--") + k.name;  // this program's words: - for _
        for (char& c : selector) c = c == '_' ? '-' : c;
        if (flag == selector) kind = &k;
      }
      if (kind == nullptr) throw std::invalid_argument("unknown argument " + flag);
      a.plugins[kind->name] = value;
    }
  }
  return a;
}

ampkit::Precision precision_of(const std::string& name) {
  if (const std::optional<ampkit::Precision> p = ampkit::parse_precision(name)) return *p;
  throw std::invalid_argument("precision must be " + ampkit::precision_names(", ") + ", got " + name);
}

int run(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  const ampkit::Precision precision = precision_of(args.precision);
  torch::manual_seed(0);

  // The user's data: y = sum of squares of x plus noise, 512 samples, batches of 64.
  const at::Tensor x = torch::randn({512, 8});
  const at::Tensor y = x.pow(2).sum(1, /*keepdim=*/true) + 0.1 * torch::randn({512, 1});
  Regressor model;
  std::vector<at::Tensor> parameters;
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) {
    names.push_back(p.key());
    parameters.push_back(p.value());
  }
  torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(0.01).momentum(0.9));

  // The strategies, by name. The installed built-in plugins are searched besides AMPKIT_PLUGIN_PATH;
  // with a static ampkit these could be linked in instead (ampkit_link_static_plugins).
  ampkit::RegistryOptions registry_options;
  registry_options.plugin_dirs.emplace_back(AMPKIT_EXAMPLE_PLUGIN_DIR);
  ampkit::Registry registry(registry_options);
  std::map<std::string, ampkit::StrategyChoice> choices;
  for (const auto& [kind, name] : args.plugins) {
    ampkit::StrategyChoice& c = choices[kind];  // + AMPKIT_<KIND>_<OPTION> from the environment
    c.name = name;
    if (args.options.count(kind)) c.options.command_line = args.options.at(kind);
    c.options.precision = precision;  // picks per-precision defaults
  }
  const std::unique_ptr<ampkit::StrategySet> strategies = ampkit::StrategySet::load(registry, choices);
  strategies->create();
  nlohmann::json chosen;
  for (const auto& s : strategies->all())
    chosen[s.kind] = {{"name", s.plugin->info().name},
                      {"version", s.plugin->info().version},
                      {"options", s.options.values.all()}};
  strategies->comm().init(ampkit::DistributedConfig{});
  const ampkit::TrainerStrategies s{&strategies->scaler(), &strategies->clipper(), &strategies->nan_policy(),
                                    &strategies->comm()};
  ampkit::LrSchedule schedule;
  schedule.base_lr = 0.01;
  ampkit::Trainer trainer(precision, /*accumulation_steps=*/1, parameters, names, optimizer, s, schedule);
  trainer.start(ampkit::RunInfo{});

  // The user's loop: ampkit does one optimizer step per call; the metrics name the strategies.
  ampkit::MetricsWriter metrics(args.metrics);
  const auto start = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < args.steps; ++step) {
    const int64_t begin = (step % 8) * 64;
    const ampkit::StepOutcome outcome = trainer.step([&](int /*micro_batch*/) {
      const at::Tensor xb = x.slice(0, begin, begin + 64), yb = y.slice(0, begin, begin + 64);
      return torch::nn::functional::mse_loss(model->forward(xb).to(at::kFloat), yb);
    });
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json record =
        ampkit::step_record(outcome, 0, trainer.steps_skipped(), 64.0 * (step + 1) / elapsed, elapsed)
            .to_json();
    record["plugins"] = {{"scaler", args.plugins.at("scaler")},
                         {"clipper", args.plugins.at("clipper")},
                         {"nan_policy", args.plugins.at("nan_policy")},
                         {"comm", args.plugins.at("comm")}};
    metrics.write(record);
    if (step == 0) first_loss = outcome.stats.loss;
    last_loss = outcome.stats.loss;
  }
  const nlohmann::json summary = {
      {"precision", args.precision},        {"plugins", chosen},
      {"steps", trainer.steps_attempted()}, {"skipped_steps", trainer.steps_skipped()},
      {"first_loss", first_loss},           {"final_loss", last_loss}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // ampkit::Error says what to fix in one line
    std::fprintf(stderr, "embed_trainer: error: %s\n", e.what());
    return 2;
  }
}
