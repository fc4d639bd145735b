// The run summary: what --summary writes and the table on stdout shows (docs/configuration.md).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ampkit::train {

struct RunSummary {
  struct Plugin {
    std::string name, version;
  };
  std::string status;          // completed | aborted | interrupted
  std::string abort_reason;    // written when aborted
  std::string interrupted_by;  // the signal's name, written when interrupted
  std::string resumed_from;    // written when resumed
  std::string checkpoint;      // the last one written, when any
  std::string workload, precision;
  std::map<std::string, Plugin> plugins;  // by kind
  int64_t steps = 0, steps_taken = 0, skipped_steps = 0, steps_discarded = 0, rollbacks = 0;
  int restarts = 0;  // by the launcher (--max-restarts), before this run
  bool aborted = false;
  nlohmann::json nan_reports = nlohmann::json::array();  // the NaN locator's, every rank's
  int64_t nan_events = 0;
  double clip_rate = 0;
  double final_loss = 0;  // the mean of the last applied steps' losses; not finite: "nan"
  std::optional<double> test_loss, test_accuracy, test_perplexity;
  double samples_per_second = 0, wall_seconds = 0;
  std::string param_sha256;
  nlohmann::json located_by;  // the rank whose report located a fault first; null: none
  std::vector<std::string> warnings;
  // The step's machinery: the statistics recipe, the host sync that ran (step |
  // deferred) and why, and the engine's device-to-host reads over the run (host_reads.h).
  std::string stats_recipe, host_sync, host_sync_reason;
  int64_t host_reads = 0;
  // Multi-process runs (rank_sync.h, add_rank_summaries).
  std::optional<int> world_size;
  std::vector<std::string> param_sha256_ranks;
  bool ranks_identical = true;
  std::vector<double> rank_samples_per_second;

  nlohmann::json to_json() const;
};

}  // namespace ampkit::train
