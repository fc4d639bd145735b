// Data parallelism of the Trainer: torch's C++ DDP Reducer attached to the parameters, after
// every rank checked that all ranks hold the same model layout (docs/architecture.md, step 3).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <unordered_map>

#include "ampkit/error.h"
#include "ampkit/host_reads.h"
#include "ampkit/step_values_carrier.h"
#include "ampkit/trainer.h"

namespace ampkit {

namespace {

// Each rank's model layout: tensor count, elements, and a 32-bit hash of the shapes and dtypes
// (each exact in a double).
std::array<double, 3> layout_fingerprint(const std::vector<at::Tensor>& tensors) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&hash](uint64_t v) {
    hash ^= v;
    hash *= 1099511628211ull;
  };
  int64_t elements = 0;
  for (const auto& t : tensors) {
    mix(static_cast<uint64_t>(t.scalar_type()));
    mix(static_cast<uint64_t>(t.dim()));
    for (int64_t d : t.sizes()) mix(static_cast<uint64_t>(d));
    elements += t.numel();
  }
  return {static_cast<double>(tensors.size()), static_cast<double>(elements),
          static_cast<double>(hash & 0xffffffffull)};
}

// Every rank learns every rank's layout and all of them stop with the same message when they
// differ. torch's verify_params_across_processes fails only on the ranks that differ from rank
// 0, which leaves rank 0 waiting in the next collective for a rank that has gone.
void check_same_layout(CommBackend& comm, const std::vector<at::Tensor>& tensors) {
  const int world = comm.world_size();
  const std::array<double, 3> mine = layout_fingerprint(tensors);
  const at::Device device = tensors.empty() ? at::Device(at::kCPU) : tensors.front().device();
  const at::Tensor local =
      at::tensor(at::ArrayRef<double>(mine.data(), mine.size()), at::TensorOptions().dtype(at::kDouble));
  const at::Tensor all = read_to_host(comm.all_gather(local.to(device))).contiguous();
  auto field = [&all](int r, int i) { return std::llround(all.data_ptr<double>()[r * 3 + i]); };
  for (int r = 1; r < world; ++r) {
    if (field(r, 0) == field(0, 0) && field(r, 1) == field(0, 1) && field(r, 2) == field(0, 2)) continue;
    auto describe = [&](int q) {
      return "rank " + std::to_string(q) + " has " + std::to_string(field(q, 0)) + " tensors with " +
             std::to_string(field(q, 1)) + " elements";
    };
    throw Error(ErrorCategory::distributed, "the ranks' models differ: " + describe(0) + ", " + describe(r) +
                                                (field(r, 0) == field(0, 0) && field(r, 1) == field(0, 1)
                                                     ? " (their shapes or dtypes differ)"
                                                     : "") +
                                                "; every rank must build the same model");
  }
}

}  // namespace

void Trainer::enable_data_parallel(const DataParallelOptions& options) {
  CommBackend& comm = *strategies_.comm;
  data_parallel_ = options;
  if (comm.world_size() == 1 && comm.process_group() == nullptr) return;
  if (!(options.bucket_cap_mb > 0))
    throw Error(ErrorCategory::usage,
                "bucket_cap_mb must be > 0, got " + std::to_string(options.bucket_cap_mb));
  {
    std::vector<at::Tensor> model = parameters_;
    model.insert(model.end(), options.buffers.begin(), options.buffers.end());
    check_same_layout(comm, model);
  }
  // One owning reference, taken once (the rule in comm_backend.h): the backend keeps the group in
  // an intrusive_ptr, so reclaiming from its raw pointer only adds a count.
  c10d::ProcessGroup* raw = comm.process_group();
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  if (raw != nullptr) group = c10::intrusive_ptr<c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(raw);
  if (group) {
    // check_same_layout has already stopped every rank on a different layout; this compares the
    // shapes themselves, for the 1 in 2^32 chance that two layouts share the 32-bit hash.
    try {
      c10d::verify_params_across_processes(group, parameters_, std::nullopt);
    } catch (const c10::Error& e) {
      throw Error(ErrorCategory::distributed, "the ranks' models differ: " + e.msg());
    }
  }
  {
    at::NoGradGuard no_grad;  // parameters are leaves that require grad: copy into them untracked
    std::vector<at::Tensor> state = parameters_;
    state.insert(state.end(), options.buffers.begin(), options.buffers.end());
    comm.broadcast(state, 0);
  }
  if (!group) return;
  // As torch.nn.parallel.DistributedDataParallel builds it: a small first bucket (1 MiB) so the
  // all-reduce starts early, then bucket_cap_mb; buckets in reverse order (backward's order).
  const int64_t cap = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  const int64_t first_cap = 1024 * 1024;
  // The step's values ride in the buckets beside the gradients (StepValuesCarrier): one more
  // small fp32 parameter, which the bucket assignment places like any other. One rank has no
  // values to exchange (step 3 keeps its loss), so no carrier.
  std::vector<at::Tensor> reduced = parameters_;
  if (comm.world_size() > 1) {
    const at::Device device = parameters_.empty() ? at::Device(at::kCPU) : parameters_.front().device();
    carrier_ = std::make_unique<StepValuesCarrier>(comm.world_size(), comm.rank(),
                                                   at::TensorOptions().device(device));
    reduced.push_back(carrier_->parameter());
  }
  auto [indices, limits] = c10d::compute_bucket_assignment_by_size(
      reduced, {static_cast<size_t>(first_cap), static_cast<size_t>(cap)},
      std::vector<bool>(reduced.size(), false));
  std::reverse(indices.begin(), indices.end());
  std::vector<int64_t> limit_list(limits.rbegin(), limits.rend());
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names_.size(); ++i) param_names[i] = names_[i];
  if (carrier_) param_names[names_.size()] = "ampkit.step_values";
  reducer_ = std::make_unique<c10d::Reducer>(
      reduced, std::move(indices), group, std::vector<bool>(reduced.size(), false), cap,
      options.find_unused_parameters, options.gradient_as_bucket_view, std::move(param_names), first_cap,
      /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, std::move(limit_list));
}

}  // namespace ampkit
