// Resume, checkpoint keeping and rollback keeping (docs/configuration.md, "Checkpoints";
// docs/troubleshooting-nan.md, "Rollback"). Rank 0 writes checkpoints; every rank loads them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/model_view.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/checkpoint.h"
#include "session/session.h"

namespace ampkit::train {

// Parameters and buffers by name: what a checkpoint's model.pt holds.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(const ModelView& model);

// Loads the checkpoint --resume names (or, for auto, the newest valid one) into the run: the model
// always; without --weights-only also the optimizer, plugin states, counters, host state and RNG,
// after checking that the same plugins and optimizer are selected. Returns the folder resumed
// from, or "" for a fresh start; the corrupt checkpoints auto skipped go into `warnings`.
std::string resume(SessionObjects& run, std::vector<std::string>& warnings);

// Writes checkpoints: periodically, at the end, and on demand (a rollback's first target).
class CheckpointKeeper {
 public:
  CheckpointKeeper(SessionObjects& run, bool writes, int64_t steps_per_epoch);
  bool writes() const { return writes_; }
  void save();
  // After a step: every --checkpoint-every attempted steps.
  void after_step();
  // At the end (an aborted run too: the bad step was not applied, so the parameters are the last
  // good ones), unless the last step was just saved.
  void at_end();
  const std::string& last() const { return last_; }
  // The CPU random state a checkpoint saves where it is not the current one: the deferred loop
  // handles a step's record after the next step's forward has drawn from it. nullopt: the current.
  void hold_rng_state(std::optional<std::string> state) { held_rng_state_ = std::move(state); }
  // What writing said (a checkpoint left undeleted, a corrupt one deleted), for the summary.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  SessionObjects& run_;
  bool writes_;
  int64_t steps_per_epoch_;
  int64_t last_saved_;
  std::string last_;
  std::vector<std::string> warnings_;
  std::optional<std::string> held_rng_state_;
};

// Keeps what a rollback returns to: an in-memory snapshot every snapshot_every taken steps, or
// the newest checkpoint; and hands the Trainer its rollback handler.
class RollbackKeeper {
 public:
  RollbackKeeper(SessionObjects& run, const RollbackPlan& plan, CheckpointKeeper& checkpoints);
  void after_step(const StepOutcome& out);
  // What the last rollback restored ("in-memory snapshot before step N", or a checkpoint folder).
  const std::string& source() const { return source_; }

 private:
  int64_t restore();
  SessionObjects& run_;
  RollbackPlan plan_;
  MemorySnapshot snapshot_;
  std::string source_;
};

}  // namespace ampkit::train
