// What the ranks of a multi-process run tell each other beyond the gradients: every rank's
// values (gather), each step's packed values (stop signal, throughput), the debug cross-check of
// decisions, the final hashes.
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

// Each rank's `local` values, in rank order, on every rank: one all_gather and one counted read.
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

// What each rank sends every other rank with each step's loss (Trainer::set_rank_values): the stop
// signal it received (0: none) and its throughput, its share of the global samples/s measured from
// the previous step's exchange to this one. No collective and no host read of their own.
std::vector<double> step_rank_values(int stop_signal, double samples_per_second);
struct RankStep {
  std::vector<double> samples_per_second;  // each rank's, in rank order
  int stop_signal = 0;                     // a signal any rank received: every rank stops after this step
};
RankStep read_step_rank_values(const std::vector<double>& all);

// --check-ranks (debugging, and the tests that prove ranks agree): one more small all_gather
// after the step; every rank must have taken the same decision with the same scale (they must:
// they saw the same averaged statistics), or every rank stops with a distributed error naming both.
void check_same_decision(CommBackend& comm, const at::Device& device, int64_t step, const StepOutcome& out);
// --check-ranks under --fp8 with a recipe that keeps scales: every rank's next scales, bit for bit
// (the amaxes are reduced across ranks before each update, so they must be).
void check_same_fp8_scales(CommBackend& comm, const at::Device& device, int64_t step,
                           const std::vector<float>& scales);

// Every rank's parameter hash and samples/s into the summary, so one file shows that the replicas
// stayed identical (a warning on stderr when they did not), and every rank's NaN reports.
void add_rank_summaries(CommBackend& comm, const at::Device& device, RunSummary& summary);

}  // namespace ampkit::train
