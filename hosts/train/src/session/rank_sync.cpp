// Rank agreement: small all-gathers over the comm backend's all_reduce_mean.
#include "session/rank_sync.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "ampkit/error.h"

namespace ampkit::train {

CommBackend* g_comm = nullptr;

std::vector<double> gather(CommBackend& comm, const std::vector<double>& local, const at::Device& device) {
  const int64_t n = static_cast<int64_t>(local.size()), world = comm.world_size();
  if (world == 1) return local;
  at::Tensor all = at::zeros({world * n}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t i = 0; i < n; ++i) all[comm.rank() * n + i] = local[static_cast<size_t>(i)];
  std::vector<at::Tensor> tensors = {all.to(device)};
  comm.all_reduce_mean(tensors);
  const at::Tensor sum = tensors[0].cpu() * static_cast<double>(world);
  std::vector<double> out(static_cast<size_t>(world * n));
  for (int64_t i = 0; i < world * n; ++i) out[static_cast<size_t>(i)] = sum[i].item<double>();
  return out;
}

void check_same_settings(CommBackend& comm, const at::Device& device,
                         const std::vector<std::pair<std::string, std::string>>& settings) {
  if (comm.world_size() == 1 || settings.empty()) return;
  std::vector<double> hashes;
  for (const auto& [name, value] : settings) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a; 24 bits survive the gather's mean exactly
    for (const char c : name + "=" + value) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    hashes.push_back(static_cast<double>(h & 0xFFFFFFu));
  }
  const std::vector<double> all = gather(comm, hashes, device);
  const size_t n = settings.size();
  std::string differing, mine;
  for (size_t i = 0; i < n; ++i)
    for (int r = 0; r < comm.world_size(); ++r)
      if (std::llround(all[static_cast<size_t>(r) * n + i]) != std::llround(hashes[i])) {
        differing += (differing.empty() ? "" : ", ") + settings[i].first;
        mine += (mine.empty() ? "" : ", ") + settings[i].first + "=" + settings[i].second;
        break;
      }
  if (!differing.empty())
    throw Error(ErrorCategory::usage, "the ranks were started with different settings: " + differing +
                                          " (this rank, " + std::to_string(comm.rank()) + ": " + mine +
                                          "); start every rank with the same ones");
}

std::vector<double> agree_on_step(CommBackend& comm, const at::Device& device, int64_t step, double sps,
                                  int stop_signal, const StepOutcome& out, int& agreed_stop) {
  constexpr size_t kFields = 4;
  const int world = comm.world_size();
  const std::vector<double> all = gather(comm,
                                         {sps / world, static_cast<double>(stop_signal),
                                          static_cast<double>(out.decision.action), out.scale_next},
                                         device);
  std::vector<double> per_rank;
  for (int r = 0; r < world; ++r) {
    const double* f = &all[static_cast<size_t>(r) * kFields];
    per_rank.push_back(f[0]);
    if (f[1] != 0) agreed_stop = static_cast<int>(f[1]);
    if (f[2] != all[2] || f[3] != all[3])
      throw Error(ErrorCategory::distributed,
                  "ranks disagree at step " + std::to_string(step) + ": rank 0 decided " +
                      to_string(static_cast<NanAction>(static_cast<int>(all[2]))) + " with scale " +
                      std::to_string(all[3]) + ", rank " + std::to_string(r) + " decided " +
                      to_string(static_cast<NanAction>(static_cast<int>(f[2]))) + " with scale " +
                      std::to_string(f[3]) + " (a plugin that is not deterministic in its inputs?)");
  }
  return per_rank;
}

void add_rank_summaries(CommBackend& comm, const at::Device& device, nlohmann::json& summary) {
  const int world = comm.world_size();
  const std::string mine = summary["param_sha256"].get<std::string>();
  std::vector<double> codes(mine.begin(), mine.end());
  codes.resize(64, 0.0);
  const std::vector<double> all = gather(comm, codes, device);
  std::vector<std::string> hashes;
  for (int r = 0; r < world; ++r) {
    std::string h;
    for (int i = 0; i < 64; ++i) h += static_cast<char>(std::lround(all[static_cast<size_t>(r * 64 + i)]));
    hashes.push_back(h);
  }
  summary["world_size"] = world;
  summary["param_sha256_ranks"] = hashes;
  summary["ranks_identical"] =
      std::all_of(hashes.begin(), hashes.end(), [&](const std::string& h) { return h == hashes[0]; });
  summary["rank_samples_per_second"] =
      gather(comm, {summary["samples_per_second"].get<double>() / world}, device);
  if (!summary["ranks_identical"].get<bool>())
    std::fprintf(stderr, "ampkit-train: warning: rank %d: the ranks' parameters differ at the end (%s)\n",
                 comm.rank(), summary["param_sha256_ranks"].dump().c_str());
}

}  // namespace ampkit::train
