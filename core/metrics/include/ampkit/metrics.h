// Per-step metrics (JSONL), the terminal progress line and the end-of-run summary.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/step_record.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ampkit {

// One JSON object per line per optimizer step; flushed every line so a crash loses nothing.
class MetricsWriter {
 public:
  // Empty path: disabled. A run resumed at `first_step` keeps the file's records of earlier steps.
  explicit MetricsWriter(const std::filesystem::path& file, int64_t first_step = 0);
  void write(const StepRecord& record);
  void write(const nlohmann::json& record);  // a StepRecord's to_json(), with what a caller adds
  bool enabled() const { return out_.is_open(); }

 private:
  std::filesystem::path file_;
  std::ofstream out_;
};

// The k parameters with the largest gradient norms, largest first (non-finite ones before all
// others, ties in parameter order). `norms` is StepStats::tensor_norms, `names`
// RunInfo::parameter_names (same order).
std::vector<LayerNorm> top_layers(const std::vector<std::string>& names, const std::vector<double>& norms,
                                  int64_t k);
// The indices of top_layers' choice: the k largest of `norms` in that order.
std::vector<size_t> largest_norms(const std::vector<double>& norms, int64_t k);

// Every parameter's gradient norm at every step, as CSV "step,name,grad_norm" (header first,
// one row per parameter per step, full double precision); flushed every step.
class LayerNormWriter {
 public:
  // Empty path: disabled. A run resumed at `first_step` keeps the file's rows of earlier steps.
  explicit LayerNormWriter(const std::filesystem::path& file, int64_t first_step = 0);
  void write(int64_t step, const std::vector<std::string>& names, const std::vector<double>& norms);
  bool enabled() const { return out_.is_open(); }

 private:
  std::filesystem::path file_;
  std::ofstream out_;
};

// A redrawn line with ETA on a terminal; a plain line every `every` steps otherwise.
class ProgressLine {
 public:
  ProgressLine(int64_t total_steps, int64_t every, bool enabled);
  void update(int64_t done, const StepRecord& last);
  void finish();

 private:
  int64_t total_;
  int64_t every_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// SHA-256 over every parameter's bytes in order (CPU copies, contiguous): equal hashes mean
// bit-identical parameters.
std::string parameter_sha256(const std::vector<at::Tensor>& parameters);

// Writes `summary` as pretty JSON atomically (temp file + rename).
void write_json_file(const std::filesystem::path& file, const nlohmann::json& summary);

// The summary as an aligned two-column table.
void print_summary_table(std::FILE* out, const nlohmann::json& summary);

}  // namespace ampkit
