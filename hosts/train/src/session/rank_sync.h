// What the ranks of a multi-process run tell each other beyond the gradients: every rank's
// values (gather), the per-step agreement on the decision and on stopping, the final hashes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/comm_backend.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/trainer.h"
#include "session/run_summary.h"

namespace ampkit::train {

// The comm backend of a multi-process run once the rendezvous succeeded, for main() to explain a
// failed collective (which rank was lost); null in a one-process run.
extern CommBackend* multi_rank_comm;

// Each rank's `local` values, in rank order, on every rank (an all-gather on all_reduce_mean:
// every rank fills its own slot of a zero tensor).
std::vector<double> gather(CommBackend& comm, const std::vector<double>& local, const at::Device& device);

// Each rank's `local` text, in rank order, on every rank (two gathers: lengths, then bytes).
std::vector<std::string> gather_strings(CommBackend& comm, const std::string& local,
                                        const at::Device& device);

// Settings every rank must share ("--lr" -> "0.001", "scaler.growth_interval" -> "2000"): a rank
// started with another --lr diverges for the whole run, another --steps hangs or aborts a
// collective at the end. Every rank's list is gathered right after the rendezvous; a difference
// stops every rank with one line naming each setting with rank 0's value and the differing
// ranks' values, exit 7 (a distributed error: each rank's own command line is valid).
void check_same_settings(CommBackend& comm, const at::Device& device,
                         const std::vector<std::pair<std::string, std::string>>& settings);

// One small all-gather per step: each rank's throughput, a stop signal any rank received, and a
// check that every rank took the same decision with the same scale (they must: they saw the same
// averaged statistics). Returns the ranks' samples/s; sets `agreed_stop` when a rank was
// signalled; a disagreement is a distributed error.
std::vector<double> agree_on_step(CommBackend& comm, const at::Device& device, int64_t step, double sps,
                                  int stop_signal, const StepOutcome& out, int& agreed_stop);

// Every rank's parameter hash and samples/s into the summary, so one file shows that the replicas
// stayed identical (a warning on stderr when they did not), and every rank's NaN reports.
void add_rank_summaries(CommBackend& comm, const at::Device& device, RunSummary& summary);

}  // namespace ampkit::train
