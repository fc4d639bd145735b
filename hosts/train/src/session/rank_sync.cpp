// Rank agreement: small all-gathers over the comm backend, each read to the host once (counted).
#include "session/rank_sync.h"

#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "ampkit/error.h"
#include "ampkit/host_reads.h"

namespace ampkit::train {

CommBackend* multi_rank_comm = nullptr;

std::vector<double> gather(CommBackend& comm, const std::vector<double>& local, const at::Device& device) {
  if (comm.world_size() == 1) return local;
  const at::Tensor mine =
      at::tensor(at::ArrayRef<double>(local), at::TensorOptions().dtype(at::kDouble)).to(device);
  const at::Tensor all = read_to_host(comm.all_gather(mine)).contiguous();
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

std::vector<std::string> gather_strings(CommBackend& comm, const std::string& local,
                                        const at::Device& device) {
  const int world = comm.world_size();
  if (world == 1) return {local};
  const std::vector<double> lengths = gather(comm, {static_cast<double>(local.size())}, device);
  size_t longest = 0;
  for (const double l : lengths) longest = std::max(longest, static_cast<size_t>(std::llround(l)));
  if (longest == 0) return std::vector<std::string>(static_cast<size_t>(world));
  std::vector<double> bytes(longest, 0.0);
  for (size_t i = 0; i < local.size(); ++i) bytes[i] = static_cast<unsigned char>(local[i]);
  const std::vector<double> all = gather(comm, bytes, device);
  std::vector<std::string> out(static_cast<size_t>(world));
  for (size_t r = 0; r < out.size(); ++r)
    for (size_t i = 0; i < static_cast<size_t>(std::llround(lengths[r])); ++i)
      out[r] += static_cast<char>(std::llround(all[r * longest + i]));
  return out;
}

namespace {

// "--lr (rank 0: 0.001, rank 1: 0.002)": rank 0's value and the first ranks that differ from it.
std::string describe_difference(const std::string& name,
                                const std::vector<std::map<std::string, std::string>>& ranks) {
  auto value = [&](size_t r) {
    const auto it = ranks[r].find(name);
    return it == ranks[r].end() ? std::string("not set") : it->second;
  };
  std::string text = name + " (rank 0: " + value(0);
  size_t shown = 0, more = 0;
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (value(r) == value(0)) continue;
    if (shown++ < 3)
      text += ", rank " + std::to_string(r) + ": " + value(r);
    else
      ++more;
  }
  return text + (more ? ", and " + std::to_string(more) + " more ranks" : "") + ")";
}

}  // namespace

void check_same_settings(CommBackend& comm, const at::Device& device,
                         const std::vector<std::pair<std::string, std::string>>& settings) {
  if (comm.world_size() == 1) return;
  // The settings themselves travel (a few KB once per run): a rank with another plugin has other
  // option names, which a fixed-size exchange of hashes could not even line up.
  std::string mine;
  for (const auto& [name, value] : settings) mine += name + '\t' + value + '\n';
  std::vector<std::map<std::string, std::string>> ranks;
  std::vector<std::string> names;  // rank 0's order, then names only other ranks have
  for (const std::string& text : gather_strings(comm, mine, device)) {
    auto& m = ranks.emplace_back();
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t tab = line.find('\t');
      const std::string name = line.substr(0, tab);
      m[name] = tab == std::string::npos ? "" : line.substr(tab + 1);
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::string differing;
  for (const auto& name : names)
    for (size_t r = 1; r < ranks.size(); ++r)
      if (ranks[r].count(name) != ranks[0].count(name) ||
          (ranks[0].count(name) && ranks[r].at(name) != ranks[0].at(name))) {
        differing += (differing.empty() ? "" : ", ") + describe_difference(name, ranks);
        break;
      }
  if (!differing.empty())
    throw Error(ErrorCategory::distributed, "the ranks were started with different settings: " + differing +
                                                "; start every rank with the same ones");
}

std::vector<double> step_rank_values(int stop_signal, double samples_per_second) {
  return {static_cast<double>(stop_signal), samples_per_second};
}

RankStep read_step_rank_values(const std::vector<double>& all) {
  RankStep out;
  for (size_t i = 0; i + 1 < all.size(); i += 2) {
    if (all[i] != 0) out.stop_signal = static_cast<int>(all[i]);
    out.samples_per_second.push_back(all[i + 1]);
  }
  return out;
}

void check_same_decision(CommBackend& comm, const at::Device& device, int64_t step, const StepOutcome& out) {
  const std::vector<double> all =
      gather(comm, {static_cast<double>(out.decision.action), out.scale_next}, device);
  for (size_t r = 1; 2 * r < all.size(); ++r) {
    const double* f = &all[2 * r];
    if (f[0] != all[0] || f[1] != all[1])
      throw Error(ErrorCategory::distributed,
                  "ranks disagree at step " + std::to_string(step) + ": rank 0 decided " +
                      to_string(static_cast<NanAction>(static_cast<int>(all[0]))) + " with scale " +
                      std::to_string(all[1]) + ", rank " + std::to_string(r) + " decided " +
                      to_string(static_cast<NanAction>(static_cast<int>(f[0]))) + " with scale " +
                      std::to_string(f[1]) + " (a plugin that is not deterministic in its inputs?)");
  }
}

void check_same_fp8_scales(CommBackend& comm, const at::Device& device, int64_t step,
                           const std::vector<float>& scales) {
  const std::vector<double> all = gather(comm, std::vector<double>(scales.begin(), scales.end()), device);
  const size_t n = scales.size();
  for (size_t i = n; i < all.size(); ++i)
    if (all[i] != all[i % n])
      throw Error(ErrorCategory::distributed,
                  "ranks disagree at step " + std::to_string(step) + ": fp8 scale " + std::to_string(i % n) +
                      " is " + std::to_string(all[i % n]) + " on rank 0, " + std::to_string(all[i]) +
                      " on rank " + std::to_string(i / n));
}

void add_rank_summaries(CommBackend& comm, const at::Device& device, RunSummary& summary) {
  const int world = comm.world_size();
  const std::string& mine = summary.param_sha256;
  std::vector<double> codes(mine.begin(), mine.end());
  codes.resize(64, 0.0);
  const std::vector<double> all = gather(comm, codes, device);
  std::vector<std::string> hashes;
  for (int r = 0; r < world; ++r) {
    std::string h;
    for (int i = 0; i < 64; ++i) h += static_cast<char>(std::lround(all[static_cast<size_t>(r * 64 + i)]));
    hashes.push_back(h);
  }
  summary.world_size = world;
  summary.param_sha256_ranks = hashes;
  // Every rank's NaN locator reports (each tagged with its rank): the rank that located a fault
  // is often not rank 0, which writes the summary. Session::summary() orders them. They travel
  // between processes as JSON text.
  nlohmann::json reports = nlohmann::json::array();
  for (const std::string& text : gather_strings(comm, summary.nan_reports.dump(), device))
    for (const auto& report : nlohmann::json::parse(text)) reports.push_back(report);
  summary.nan_reports = reports;
  summary.ranks_identical =
      std::all_of(hashes.begin(), hashes.end(), [&](const std::string& h) { return h == hashes[0]; });
  summary.rank_samples_per_second = gather(comm, {summary.samples_per_second / world}, device);
  if (!summary.ranks_identical)
    std::fprintf(stderr, "ampkit-train: warning: rank %d: the ranks' parameters differ at the end (%s)\n",
                 comm.rank(), nlohmann::json(hashes).dump().c_str());
}

}  // namespace ampkit::train
