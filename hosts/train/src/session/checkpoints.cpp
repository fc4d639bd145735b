// Resume, checkpoints and rollback snapshots of a session.
#include "session/checkpoints.h"

#include <ampkit/kinds.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "ampkit/error.h"
#include "session/pytorch_files.h"

namespace ampkit::train {

std::vector<std::pair<std::string, at::Tensor>> model_tensors(const ModelView& model) {
  NamedTensors out = model.named_parameters();
  const NamedTensors buffers = model.named_buffers();
  out.insert(out.end(), buffers.begin(), buffers.end());
  return out;
}

namespace {

// A full resume needs the plugins and the optimizer the checkpoint was written with.
void check_resumable(const LoadedCheckpoint& ckpt, const TrainConfig& cfg, const StrategySet& strategies) {
  const std::string where = "checkpoint " + ckpt.folder.string();
  for (const auto& p : strategies.all()) {
    const PluginInfo& info = p.plugin->info();
    const PluginStateRecord* saved = nullptr;
    for (const auto& r : ckpt.manifest.plugins)
      if (r.kind == p.kind) saved = &r;
    if (saved == nullptr && optional_kind(*find_kind(p.kind))) continue;  // restore_fp8() warns
    if (saved == nullptr)
      throw Error(ErrorCategory::checkpoint, where + " has no state for a " + p.kind + " plugin");
    // A comm plugin that declares its state empty (CommFact) and a checkpoint that holds none for
    // the comm: nothing of the comm's binds the resume, any comm continues it (a 2-rank run
    // resumed in one process, gloo's checkpoint under nccl).
    if (p.kind == "comm" && saved->state.empty() && comm_facts(strategies.comm()).state_empty) continue;
    if (saved->name != info.name || saved->version != info.version)
      throw Error(ErrorCategory::checkpoint,
                  where + " was written with " + p.kind + " '" + saved->name + "' " + saved->version +
                      ", this run selects " + p.kind + " '" + info.name + "' " + info.version +
                      "; select the same plugin, or pass --weights-only to load only the parameters");
  }
  const auto optimizer = ckpt.manifest.config.find("optimizer");
  if (optimizer != ckpt.manifest.config.end() && optimizer->second.value != cfg.optimizer)
    throw Error(ErrorCategory::checkpoint, where + " was written with --optimizer " +
                                               optimizer->second.value + ", this run uses --optimizer " +
                                               cfg.optimizer +
                                               "; pass --weights-only to load only the parameters");
}

// The checkpoint --resume names: auto picks the newest valid one in --checkpoint-dir, saying which
// it skipped (`warnings`); an empty or absent folder is a fresh start, with a note, but a folder
// whose checkpoints are all corrupt is an error: hours of training are never silently dropped
// (--resume none starts fresh on purpose). A path must be a step-N folder.
std::optional<LoadedCheckpoint> checkpoint_to_resume(const TrainConfig& cfg,
                                                     std::vector<std::string>& warnings) {
  if (cfg.resume == "none") return std::nullopt;
  if (cfg.resume == "auto") {
    std::vector<std::string> skipped;
    const auto folder = find_resume_checkpoint(cfg.checkpoint_dir, &skipped);
    if (folder) {
      for (const auto& w : skipped) {
        std::fprintf(stderr, "ampkit-train: warning: %s\n", w.c_str());
        warnings.push_back(w);
      }
      return read_checkpoint(*folder);
    }
    std::error_code ec;
    const size_t found = std::filesystem::is_directory(cfg.checkpoint_dir, ec)
                             ? list_checkpoints(cfg.checkpoint_dir).size()
                             : 0;
    if (skipped.empty() && found == 0) {
      std::fprintf(stderr, "ampkit-train: note: --resume auto: no checkpoint in %s yet; starting fresh\n",
                   cfg.checkpoint_dir.c_str());
      return std::nullopt;
    }
    std::string newest = skipped.front();
    if (found > 0) try {
        read_checkpoint(list_checkpoints(cfg.checkpoint_dir).back().second);
      } catch (const Error& e) {
        newest = e.what();
      }
    throw Error(ErrorCategory::checkpoint,
                "--resume auto: no usable checkpoint among the " + std::to_string(found) + " in " +
                    cfg.checkpoint_dir + " (newest: " + newest +
                    "); nothing was deleted: repair or move them, or pass --resume none to start fresh");
  }
  const std::filesystem::path given(cfg.resume);
  if (std::filesystem::exists(given / "latest") && !std::filesystem::exists(given / "manifest.json"))
    throw Error(ErrorCategory::usage, "--resume " + cfg.resume +
                                          " holds checkpoints; name one of its step-N folders, or use "
                                          "--checkpoint-dir " +
                                          cfg.resume + " --resume auto");
  return read_checkpoint(given);
}

// The fp8 layers' scales and histories. A checkpoint without them (written without --fp8) starts
// the scales afresh, with a warning; one with them cannot be resumed without fp8 layers: its
// parameters were trained through them, and dropping the recipe's state would be silent.
void restore_fp8(SessionObjects& run, const LoadedCheckpoint& ckpt, std::vector<std::string>& warnings) {
  const std::string where = "checkpoint " + ckpt.folder.string();
  if (run.fp8 == nullptr && !run.state.fp8.is_null())
    throw Error(ErrorCategory::checkpoint,
                where + " holds the state of fp8 recipe '" + run.state.fp8.value("recipe", std::string()) +
                    "'; resume it with --fp8 " + run.state.fp8.value("recipe", std::string()) +
                    ", or pass --weights-only to load only the parameters");
  if (run.fp8 == nullptr) return;
  if (run.state.fp8.is_null()) {
    warnings.push_back(where + " holds no fp8 state: fp8 recipe '" + run.fp8->recipe_name() +
                       "' starts its scales afresh");
    std::fprintf(stderr, "ampkit-train: warning: %s\n", warnings.back().c_str());
    return;
  }
  try {
    run.fp8->load_state(run.state.fp8);
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::checkpoint, where + ": " + e.what());
  }
}

// Everything but the parameters: optimizer, plugin states, counters, host state, RNG.
void restore_run_state(SessionObjects& run, const LoadedCheckpoint& ckpt,
                       std::vector<std::string>& warnings) {
  restore_optimizer(ckpt, run.optimizer);
  for (auto& p : run.strategies.all()) {
    for (const auto& r : ckpt.manifest.plugins) {
      if (r.kind != p.kind) continue;
      try {
        p.strategy->load(r.state);
      } catch (const std::exception& e) {
        throw Error(ErrorCategory::checkpoint, "checkpoint " + ckpt.folder.string() + ": " + p.kind + " '" +
                                                   r.name + "' cannot load its saved state: " + e.what());
      }
    }
  }
  const CheckpointManifest& m = ckpt.manifest;
  run.state = m.host.get<HostState>();
  restore_fp8(run, ckpt, warnings);
  TrainerCounters counters;
  counters.attempted = m.steps_attempted;
  counters.taken = m.steps_taken;
  counters.consecutive_skips = m.consecutive_skips;
  counters.discarded = run.state.steps_discarded;
  counters.rollbacks = run.state.rollbacks;
  run.trainer.restore_counters(counters);
  set_cpu_rng_state(m.cpu_rng_state);
}

}  // namespace

std::string resume(SessionObjects& run, std::vector<std::string>& warnings) {
  if (run.cfg.resume.empty()) return "";
  const std::optional<LoadedCheckpoint> ckpt = checkpoint_to_resume(run.cfg, warnings);
  if (!ckpt) return "";
  if (!run.cfg.weights_only) check_resumable(*ckpt, run.cfg, run.strategies);
  restore_tensors(*ckpt, model_tensors(run.model));
  if (parameter_sha256(run.params) != ckpt->manifest.param_sha256)
    throw Error(ErrorCategory::checkpoint, "checkpoint " + ckpt->folder.string() +
                                               ": the restored parameters do not hash to the manifest's "
                                               "param_sha256");
  if (!run.cfg.weights_only) restore_run_state(run, *ckpt, warnings);
  std::fprintf(stderr, "ampkit-train: resumed from %s at step %lld%s\n", ckpt->folder.string().c_str(),
               static_cast<long long>(run.trainer.steps_attempted()),
               run.cfg.weights_only ? " (weights only)" : "");
  return ckpt->folder.string();
}

CheckpointKeeper::CheckpointKeeper(SessionObjects& run, bool writes, int64_t steps_per_epoch)
    : run_(run),
      writes_(writes),
      steps_per_epoch_(steps_per_epoch),
      last_saved_(run.trainer.steps_attempted()) {}

void CheckpointKeeper::save() {
  const TrainerCounters counters = run_.trainer.counters();
  CheckpointManifest m;
  m.steps_attempted = counters.attempted;
  m.steps_taken = counters.taken;
  m.consecutive_skips = counters.consecutive_skips;
  m.epoch = (counters.attempted + run_.state.data_skip) / steps_per_epoch_;
  for (const auto& s : run_.cfg.settings) m.config[s.name] = {s.value, s.source};
  for (const auto& p : run_.strategies.all())
    m.plugins.push_back({p.kind, p.plugin->info().name, p.plugin->info().version, p.strategy->save()});
  m.cpu_rng_state = held_rng_state_ ? *held_rng_state_ : cpu_rng_state();
  m.param_sha256 = parameter_sha256(run_.params);
  run_.state.steps_discarded = counters.discarded;
  run_.state.rollbacks = counters.rollbacks;
  if (run_.fp8 != nullptr) run_.state.fp8 = run_.fp8->state();
  m.host = run_.state;
  std::vector<std::string> warnings;
  last_ = write_checkpoint(run_.cfg.checkpoint_dir, std::move(m), model_tensors(run_.model), run_.optimizer,
                           run_.cfg.keep_checkpoints, pytorch_checkpoint_files(run_), &warnings)
              .string();
  for (const auto& w : warnings) {
    std::fprintf(stderr, "ampkit-train: warning: %s\n", w.c_str());
    warnings_.push_back(w);
  }
  last_saved_ = counters.attempted;
}

void CheckpointKeeper::after_step() {
  if (writes_ && run_.cfg.checkpoint_every > 0 &&
      run_.trainer.steps_attempted() % run_.cfg.checkpoint_every == 0)
    save();
}

void CheckpointKeeper::at_end() {
  if (writes_ && last_saved_ != run_.trainer.steps_attempted()) save();
}

RollbackKeeper::RollbackKeeper(SessionObjects& run, const RollbackPlan& plan, CheckpointKeeper& checkpoints)
    : run_(run), plan_(plan) {
  if (!plan_.enabled()) return;
  if (plan_.snapshot_every > 0)
    snapshot_.capture(model_tensors(run_.model), run_.optimizer, run_.trainer.steps_attempted(),
                      run_.trainer.steps_taken());
  if (plan_.from_checkpoint && checkpoints.writes() && !find_resume_checkpoint(run_.cfg.checkpoint_dir))
    checkpoints.save();  // a rollback before the first periodic checkpoint needs one to go to
  run_.trainer.set_rollback_handler([this] { return restore(); });
}

int64_t RollbackKeeper::restore() {
  if (!plan_.from_checkpoint) {
    source_ = "in-memory snapshot before step " + std::to_string(snapshot_.steps_attempted());
    return snapshot_.restore(model_tensors(run_.model), run_.optimizer);
  }
  const auto folder = find_resume_checkpoint(run_.cfg.checkpoint_dir);
  if (!folder)
    throw Error(ErrorCategory::checkpoint,
                "rollback: no valid checkpoint in " + run_.cfg.checkpoint_dir + " to roll back to");
  const LoadedCheckpoint ckpt = read_checkpoint(*folder);
  restore_tensors(ckpt, model_tensors(run_.model));
  restore_optimizer(ckpt, run_.optimizer);
  source_ = ckpt.folder.string();
  return ckpt.manifest.steps_taken;
}

void RollbackKeeper::after_step(const StepOutcome& out) {
  if (plan_.snapshot_every > 0 && out.stepped && run_.trainer.steps_taken() % plan_.snapshot_every == 0)
    snapshot_.capture(model_tensors(run_.model), run_.optimizer, run_.trainer.steps_attempted(),
                      run_.trainer.steps_taken());
}

}  // namespace ampkit::train
