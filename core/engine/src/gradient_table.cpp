// A parameter list's gradients and their statistics pass, kept between steps (gradient_table.h).
#include "ampkit/gradient_table.h"

#include <ATen/Functions.h>

#include <cmath>
#include <string>
#include <utility>

#include "ampkit/error.h"
#include "ampkit/host_reads.h"
#include "stats_recipes.h"
#include "stream_use.h"

namespace ampkit {

namespace {
constexpr const char* kCapturedGradientsDiffer =
    "the gradients captured in a CUDA graph differ in number or size from the warm-up step's: warm up with "
    "the same parameters before capturing";

// The pinned buffer a capture copies its chunk table from (`chunks` entries of two), made outside
// a capture: at every uncaptured step where it is missing, so that any uncaptured step readies
// the next capture (one before each capture is needed: a capture keeps the buffer it used).
void keep_staging(at::Tensor& staging, size_t chunks) {
  const auto entries = static_cast<int64_t>(2 * chunks);
  if (!staging.defined() || staging.numel() != entries)
    staging = at::empty({entries}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
}
}  // namespace

GradStatsPass::GradStatsPass(DeviceStatsRecipe recipe) : recipe_(recipe) {
  if (recipe_ == DeviceStatsRecipe::automatic)
    throw Error(ErrorCategory::internal, "GradStatsPass needs a resolved recipe, not automatic");
}

GradStats GradStatsPass::run(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                             std::vector<double>& scalar_values) {
  if (reduction_) return run_reduced(grads, scalars, scalar_values);
  if (recipe_ == DeviceStatsRecipe::chunk_kernel) return run_chunk_kernel(grads, scalars, scalar_values);
  return run_stateless_recipe(recipe_, grads, scalars, scalar_values);
}

// The chunks' four numbers (on the device by the kernel, on CPU tensors by the host), their sum
// of squares reduced on the device, then the scalars, in one buffer. The plan, its device table
// and the buffers are made again only when the gradients moved or the sizes changed. Returns the
// number of chunk numbers (4 per chunk); the total sits right after them.
int64_t GradStatsPass::fill_chunk_buffer(const std::vector<at::Tensor>& grads,
                                         const std::vector<at::Tensor>& scalars, bool capturing) {
  if (!plan_matches(plan_, grads)) {
    if (!chunk_kernel_dtypes(grads))
      throw Error(ErrorCategory::usage,
                  "the chunk_kernel statistics recipe takes float, half and bfloat16 gradients only");
    plan_ = plan_stats_chunks(grads);
    table_ = at::Tensor();
    auto chunk_tensors = std::make_shared<std::vector<size_t>>();
    chunk_tensors->reserve(plan_.chunks.size());
    for (const StatsChunk& c : plan_.chunks) chunk_tensors->push_back(c.tensor);
    chunk_tensors_ = std::move(chunk_tensors);
    ++plans_made_;
  }
  at::Device device(at::kCPU);
  for (const auto& g : grads)
    if (g.defined() && g.numel() > 0) {
      device = g.device();
      break;
    }
  if (plan_.chunks.empty() && !scalars.empty()) device = scalars.front().device();
  const int64_t numbers = 4 * static_cast<int64_t>(plan_.chunks.size());
  int64_t size = numbers + 1;
  for (const auto& s : scalars) size += s.numel();
  if (!packed_.defined() || packed_.numel() != size || packed_.device() != device) {
    if (capturing) throw Error(ErrorCategory::usage, kCapturedGradientsDiffer);
    packed_ = at::zeros({size}, at::TensorOptions().device(device).dtype(at::kDouble));
    host_ = device.is_cpu() ? packed_
                            : at::empty({size}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  }
  if (numbers > 0) {
    if (device.is_cuda()) {
      if (!table_.defined())
        upload_table(device, capturing);
      else if (!capturing)
        keep_staging(staging_, plan_.chunks.size());
      mark_used_on_current_stream(table_);
      launch_chunk_kernel(plan_, table_, packed_);
      if (capturing) graph_held_.push_back(table_);  // read at every replay
    } else {
      double* out = packed_.data_ptr<double>();
      for (const StatsLaunch& launch : plan_.launches)
        for (size_t c = launch.first; c < launch.first + launch.count; ++c)
          chunk_stats_on_host(plan_.chunks[c], launch.dtype, out + 4 * c);
    }
    // The total in one reduction on the device: the synchronous and the deferred step (which reads
    // nothing) see the same sum, to the bit.
    at::Tensor total = packed_.narrow(0, numbers, 1);
    at::sum_out(total, packed_.narrow(0, 0, numbers).view({-1, 4}).select(1, 0), {0},
                /*keepdim=*/true);
  }
  if (capturing) graph_held_.push_back(packed_);  // written at every replay
  mark_used_on_current_stream(packed_);
  // The copies the plan made of gradients with gaps were read by the launches above (a
  // freed block is reused on the stream only after them); the plan keeps no gradient alive.
  plan_.data.clear();
  int64_t offset = numbers + 1;
  for (const auto& s : scalars) {
    packed_.narrow(0, offset, s.numel()).copy_(s.detach().reshape({-1}));
    offset += s.numel();
  }
  return numbers;
}

// The plan's chunk table to the device. Outside a capture from a new buffer of the host
// allocator's (which keeps it until the copy has run), and a staging buffer is readied for a
// capture to come; in a capture, from that staging buffer, which the copy node reads at every
// replay: it is never written again, and the next uncaptured step makes a new one.
void GradStatsPass::upload_table(const at::Device& device, bool capturing) {
  if (!capturing) {
    table_ = upload_chunk_table(plan_, device);
    keep_staging(staging_, plan_.chunks.size());
    return;
  }
  if (!staging_.defined())
    throw Error(ErrorCategory::usage,
                "a CUDA graph capture needs one uncaptured step since the last capture: run one deferred "
                "iteration outside the graph before capturing again");
  if (staging_.numel() != static_cast<int64_t>(2 * plan_.chunks.size()))
    throw Error(ErrorCategory::usage, kCapturedGradientsDiffer);
  table_ = upload_chunk_table(plan_, device, &staging_);
  graph_held_.push_back(staging_);
  staging_ = at::Tensor();
}

GradStats GradStatsPass::run_chunk_kernel(const std::vector<at::Tensor>& grads,
                                          const std::vector<at::Tensor>& scalars,
                                          std::vector<double>& scalar_values) {
  const int64_t numbers = fill_chunk_buffer(grads, scalars);
  read_into_host(host_, packed_);  // the step's one read
  const double* v = host_.data_ptr<double>();
  scalar_values.assign(v + numbers + 1, v + packed_.numel());
  GradStats stats = combine_chunk_stats(plan_, grads, numbers > 0 ? v : nullptr);
  stats.sum_squares = v[numbers];
  return stats;
}

// This rank's totals reduced across the group on the device, then read with whatever the recipe
// reads for the per-tensor norms (the chunks' numbers), in one read. Every rank calls reduce() once
// per pass, with or without gradients of its own, so no rank waits for a collective another skipped.
GradStats GradStatsPass::run_reduced(const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& scalars,
                                     std::vector<double>& scalar_values) {
  if (recipe_ == DeviceStatsRecipe::foreach_ops)
    return foreach_ops_stats_reduced(grads, scalars, scalar_values, *reduction_);
  GradStats stats;
  at::Tensor local, numbers_read;
  int64_t numbers = 0;
  if (recipe_ == DeviceStatsRecipe::fused_scan) {  // CPU tensors: the scan's numbers as a CPU vector
    stats = compute_grad_stats(grads);
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    const double max_abs = std::isnan(stats.sum_squares) ? std::nan("") : stats.max_abs;
    local = stats_reduction_vector(at::scalar_tensor(stats.sum_squares, f64), at::scalar_tensor(max_abs, f64),
                                   at::scalar_tensor(static_cast<double>(stats.zeros), f64), stats.elements,
                                   scalars);
  } else {
    numbers = fill_chunk_buffer(grads, scalars);
    const DeviceTotals t = chunk_totals(numbers);
    local = stats_reduction_vector(t.sum_squares, t.max_abs, t.zeros, t.elements, {t.scalars});
    numbers_read = packed_.narrow(0, 0, numbers);
  }
  const at::Tensor reduced = reduction_->reduce(local);
  const at::Tensor host =
      read_to_host(numbers > 0 ? at::cat({numbers_read, reduced}) : reduced).contiguous();  // the one read
  const double* v = host.data_ptr<double>();
  if (recipe_ == DeviceStatsRecipe::chunk_kernel)
    stats = combine_chunk_stats(plan_, grads, numbers > 0 ? v : nullptr);
  take_reduced_totals(v + numbers, reduced.numel(), stats, scalar_values);
  return stats;
}

DeviceTotals GradStatsPass::run_on_device(const std::vector<at::Tensor>& grads,
                                          const std::vector<at::Tensor>& scalars, bool tensor_sums,
                                          bool capturing) {
  DeviceTotals t = local_totals(grads, scalars, tensor_sums, capturing);
  if (reduction_) reduce_totals(t);
  return t;
}

// The group's totals and scalars in place of this rank's, from the same vector run_reduced reduces,
// still on the device; the per-tensor sums stay this rank's, as run_reduced leaves them.
void GradStatsPass::reduce_totals(DeviceTotals& t) const {
  const at::Tensor reduced =
      reduction_->reduce(stats_reduction_vector(t.sum_squares, t.max_abs, t.zeros, t.elements, {t.scalars}));
  t.sum_squares = reduced.select(0, StatsReduction::kSumSquares);
  t.max_abs = reduced.select(0, StatsReduction::kMaxAbs);
  t.zeros = reduced.select(0, StatsReduction::kZeros);
  t.group_elements = reduced.select(0, StatsReduction::kElements);
  t.scalars = reduced.narrow(0, StatsReduction::kFields, reduced.numel() - StatsReduction::kFields);
}

DeviceTotals GradStatsPass::local_totals(const std::vector<at::Tensor>& grads,
                                         const std::vector<at::Tensor>& scalars, bool tensor_sums,
                                         bool capturing) {
  DeviceTotals t;
  if (recipe_ == DeviceStatsRecipe::fused_scan) {  // CPU tensors: the scan's numbers as tensors
    const GradStats g = compute_grad_stats(grads);
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    t.sum_squares = at::scalar_tensor(g.sum_squares, f64);
    t.max_abs = at::scalar_tensor(std::isnan(g.sum_squares) ? std::nan("") : g.max_abs, f64);
    t.zeros = at::scalar_tensor(static_cast<double>(g.zeros), f64);
    std::vector<at::Tensor> flat;
    for (const auto& s : scalars) flat.push_back(s.detach().to(at::kDouble).reshape({-1}));
    t.scalars = flat.empty() ? at::zeros({0}, f64) : at::cat(flat);
    t.elements = g.elements;
    if (tensor_sums) t.tensor_sum_squares = g.tensor_sum_squares;
    t.tensors = grads.size();
    return t;
  }
  if (recipe_ != DeviceStatsRecipe::chunk_kernel)
    throw Error(ErrorCategory::internal,
                std::string("no deferred statistics for the ") + to_string(recipe_) + " recipe");
  const int64_t numbers = fill_chunk_buffer(grads, scalars, capturing);
  t = chunk_totals(numbers);
  t.tensors = grads.size();
  if (tensor_sums) {
    t.chunk_tensors = chunk_tensors_;
    if (numbers > 0) t.chunk_sum_squares = packed_.narrow(0, 0, numbers).view({-1, 4}).select(1, 0);
  }
  return t;
}

// The totals of the chunk buffer as filled, on the device; `numbers`: fill_chunk_buffer's count.
DeviceTotals GradStatsPass::chunk_totals(int64_t numbers) const {
  DeviceTotals t;
  t.sum_squares = packed_.narrow(0, numbers, 1).reshape({});
  t.scalars = packed_.narrow(0, numbers + 1, packed_.numel() - numbers - 1);
  t.elements = 0;
  for (const int64_t n : plan_.sizes) t.elements += n;
  if (numbers == 0) {
    t.max_abs = at::zeros({}, packed_.options());
    t.zeros = at::zeros({}, packed_.options());
    return t;
  }
  const at::Tensor parts = packed_.narrow(0, 0, numbers).view({-1, 4});
  // A maximum does not see NaN: where an element is NaN the largest |gradient| is NaN, as on the host.
  t.max_abs = at::where(at::isnan(t.sum_squares), std::nan(""), parts.select(1, 1).max());
  t.zeros = parts.select(1, 2).sum();
  return t;
}

std::vector<double> tensor_sums(const DeviceTotals& totals, const double* chunk_sums) {
  if (!totals.chunk_tensors) return totals.tensor_sum_squares;
  std::vector<double> sums(totals.tensors, 0.0);
  const std::vector<size_t>& tensor_of = *totals.chunk_tensors;
  for (size_t c = 0; c < tensor_of.size(); ++c)
    sums[tensor_of[c]] += chunk_sums[c];  // combine_chunk_stats' order
  return sums;
}

GradientTable::GradientTable(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                             DeviceStatsRecipe requested)
    : parameters_(std::move(parameters)), names_(std::move(names)), pass_([&] {
        const ResolvedStatsRecipe resolved = resolve_stats_recipe(requested, parameters_);
        fallback_ = resolved.fallback;
        return resolved.recipe;
      }()) {
  if (names_.size() != parameters_.size())
    throw Error(ErrorCategory::internal, "GradientTable: parameter names and parameters differ in count");
  grads_.reserve(parameters_.size());
}

const std::vector<at::Tensor>& GradientTable::read_gradients() {
  grads_.resize(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) grads_[i] = parameters_[i].grad();
  return grads_;
}

}  // namespace ampkit
