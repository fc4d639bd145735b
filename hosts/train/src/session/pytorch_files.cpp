// GradScaler-form scaler state in checkpoints, and --init-from.
#include "session/pytorch_files.h"

#include <cstdio>
#include <string>

#include "ampkit/error.h"
#include "session/checkpoints.h"

namespace ampkit::train {

namespace {

const std::string* option_value(const SelectedStrategy& s, const std::string& name) {
  for (const auto& setting : s.options.settings)
    if (setting.name == name) return &setting.value;
  return nullptr;
}

// The run's GradScaler-like options, with the scale and tracker of `state`.
std::optional<GradScalerState> view(const SelectedStrategy& scaler, const State& state) {
  const std::string* growth = option_value(scaler, "growth_factor");
  const std::string* backoff = option_value(scaler, "backoff_factor");
  const std::string* interval = option_value(scaler, "growth_interval");
  if (!growth || !backoff || !interval || !state.has("scale") || !state.has("growth_tracker"))
    return std::nullopt;
  GradScalerState g;
  g.scale = state.get<double>("scale");
  g.growth_tracker = state.get<int64_t>("growth_tracker");
  g.growth_factor = std::stod(*growth);
  g.backoff_factor = std::stod(*backoff);
  g.growth_interval = std::stoll(*interval);
  return g;
}

void load_scaler(SessionObjects& run, const GradScalerState& given, const std::string& where) {
  SelectedStrategy& scaler = run.strategies.selected("scaler");
  State state = scaler.strategy->save();
  const std::optional<GradScalerState> ours = view(scaler, state);
  if (!ours) {
    std::fprintf(stderr,
                 "ampkit-train: warning: %s: its GradScaler state (scale %g) is not used: scaler '%s' is not "
                 "GradScaler-like (use --scaler dynamic to continue with it)\n",
                 where.c_str(), given.scale, scaler.plugin->info().name.c_str());
    return;
  }
  const auto differs = [&](const char* option, double saved, double run_value) {
    if (saved != run_value)
      throw Error(ErrorCategory::checkpoint, where + ": the GradScaler state has " + option + " " +
                                                 std::to_string(saved) + ", this run " +
                                                 std::to_string(run_value) + "; set --opt scaler." + option +
                                                 "=" + std::to_string(saved));
  };
  differs("growth_factor", given.growth_factor, ours->growth_factor);
  differs("backoff_factor", given.backoff_factor, ours->backoff_factor);
  differs("growth_interval", static_cast<double>(given.growth_interval),
          static_cast<double>(ours->growth_interval));
  state.set("scale", given.scale);
  state.set("growth_tracker", given.growth_tracker);
  try {
    scaler.strategy->load(state);
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::checkpoint, where + ": scaler '" + scaler.plugin->info().name +
                                               "' cannot take the GradScaler state: " + e.what());
  }
}

}  // namespace

std::optional<GradScalerState> grad_scaler_view(const SelectedStrategy& scaler) {
  return view(scaler, scaler.strategy->save());
}

std::vector<CheckpointFile> pytorch_checkpoint_files(SessionObjects& run) {
  const std::optional<GradScalerState> g = grad_scaler_view(run.strategies.selected("scaler"));
  if (!g) return {};
  return {{"scaler_state_dict.pt", pickle_bytes(grad_scaler_state_dict(*g))}};
}

void init_from_pytorch(SessionObjects& run) {
  const std::string where = "--init-from " + run.cfg.init_from;
  const PyTorchStart start = read_pytorch_file(run.cfg.init_from, where);
  load_state_dict_into(start.model, model_tensors(run.model), where);
  if (start.optimizer) load_optimizer_state_dict(*start.optimizer, run.optimizer, where + " ['optimizer']");
  if (start.scaler) load_scaler(run, *start.scaler, where + " ['scaler']");
  std::fprintf(stderr, "ampkit-train: initialised from %s (model%s%s)\n", run.cfg.init_from.c_str(),
               start.optimizer ? ", optimizer" : "", start.scaler ? ", scaler" : "");
  if (!start.ignored.empty()) {
    std::string names;
    for (const auto& n : start.ignored) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr,
                 "ampkit-train: note: %s: not loaded: %s (ampkit-train loads model, optimizer and scaler)\n",
                 where.c_str(), names.c_str());
  }
}

}  // namespace ampkit::train
