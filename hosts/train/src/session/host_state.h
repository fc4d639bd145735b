// The host's own state that a checkpoint keeps (the manifest's "host" object) beside the
// Trainer's counters: written and read by one to_json/from_json pair.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

namespace ampkit::train {

struct HostState {
  int64_t nan_events = 0;       // steps with a non-finite loss or gradient
  int64_t clipped_steps = 0;    // taken steps whose clip coefficient was below 1
  int64_t data_skip = 0;        // batches skipped by rollbacks: step s trains on data position s + data_skip
  int64_t locator_runs = 0;     // bad steps the NaN locator has re-run (at most --nan-locate)
  int64_t steps_discarded = 0;  // the Trainer's, copied in when saving and restored on resume
  int64_t rollbacks = 0;        // the Trainer's, likewise
  std::deque<double> recent_losses;  // the last 20 applied steps' losses (the summary's final_loss)
  nlohmann::json fp8;                // the fp8 layers' scaling state (Fp8Linears::state); null: no fp8
};

void to_json(nlohmann::json& j, const HostState& s);
// Missing keys keep their zero value (a checkpoint from before a key existed).
void from_json(const nlohmann::json& j, HostState& s);

}  // namespace ampkit::train
