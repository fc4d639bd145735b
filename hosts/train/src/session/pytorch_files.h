// The PyTorch world's files (docs/configuration.md, "PyTorch interop"): the GradScaler-form
// scaler file added to each checkpoint, and --init-from, which starts a run from a file python's
// torch.save wrote.
#pragma once

#include <optional>
#include <vector>

#include "ampkit/checkpoint.h"
#include "ampkit/pytorch_state.h"
#include "session/session.h"

namespace ampkit::train {

// The scaler's state as GradScaler.state_dict() has it, for a scaler that is GradScaler-like:
// options growth_factor, backoff_factor and growth_interval, state scale and growth_tracker
// (the built-in 'dynamic'). Others: nullopt.
std::optional<GradScalerState> grad_scaler_view(const SelectedStrategy& scaler);

// Files a checkpoint holds besides model.pt and optimizer*.pt: scaler_state_dict.pt when the
// scaler is GradScaler-like.
std::vector<CheckpointFile> pytorch_checkpoint_files(SessionObjects& run);

// --init-from: the model (strictly: every key, every shape), then the optimizer and the scaler
// when the file has them. Step 0; counters, RNG and the other plugins start fresh.
void init_from_pytorch(SessionObjects& run);

}  // namespace ampkit::train
