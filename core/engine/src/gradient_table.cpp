// A parameter list's gradients and their statistics pass, kept between steps (gradient_table.h).
#include "ampkit/gradient_table.h"

#include <ATen/ops/empty.h>

#include <utility>

#include "ampkit/error.h"
#include "ampkit/host_reads.h"
#include "stats_recipes.h"

namespace ampkit {

GradStatsPass::GradStatsPass(DeviceStatsRecipe recipe) : recipe_(recipe) {
  if (recipe_ == DeviceStatsRecipe::automatic)
    throw Error(ErrorCategory::internal, "GradStatsPass needs a resolved recipe, not automatic");
}

GradStats GradStatsPass::run(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& scalars,
                             std::vector<double>& scalar_values) {
  if (recipe_ == DeviceStatsRecipe::chunk_kernel) return run_chunk_kernel(grads, scalars, scalar_values);
  return run_stateless_recipe(recipe_, grads, scalars, scalar_values);
}

// One read of every element: the chunks' four numbers (on the device by the kernel, on CPU tensors
// by the host), then the scalars, in one buffer read once. The plan, its device table and both
// buffers are made again only when the gradients moved or the sizes changed.
GradStats GradStatsPass::run_chunk_kernel(const std::vector<at::Tensor>& grads,
                                          const std::vector<at::Tensor>& scalars,
                                          std::vector<double>& scalar_values) {
  if (!plan_matches(plan_, grads)) {
    if (!chunk_kernel_dtypes(grads))
      throw Error(ErrorCategory::usage,
                  "the chunk_kernel statistics recipe takes float, half and bfloat16 gradients only");
    plan_ = plan_stats_chunks(grads);
    table_ = at::Tensor();
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
  int64_t size = numbers;
  for (const auto& s : scalars) size += s.numel();
  if (!packed_.defined() || packed_.numel() != size || packed_.device() != device) {
    packed_ = at::empty({size}, at::TensorOptions().device(device).dtype(at::kDouble));
    host_ = device.is_cpu() ? packed_
                            : at::empty({size}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  }
  if (numbers > 0) {
    if (device.is_cuda()) {
      if (!table_.defined()) table_ = upload_chunk_table(plan_, device);
      launch_chunk_kernel(plan_, table_, packed_);
    } else {
      double* out = packed_.data_ptr<double>();
      for (const StatsLaunch& launch : plan_.launches)
        for (size_t c = launch.first; c < launch.first + launch.count; ++c)
          chunk_stats_on_host(plan_.chunks[c], launch.dtype, out + 4 * c);
    }
  }
  // The copies the plan made of non-contiguous gradients were read by the launches above (a
  // freed block is reused on the stream only after them); the plan keeps no gradient alive.
  plan_.data.clear();
  int64_t offset = numbers;
  for (const auto& s : scalars) {
    packed_.narrow(0, offset, s.numel()).copy_(s.detach().reshape({-1}));
    offset += s.numel();
  }
  scalar_values.clear();
  if (size == 0) return combine_chunk_stats(plan_, grads, nullptr);
  read_into_host(host_, packed_);  // the step's one read
  const double* v = host_.data_ptr<double>();
  scalar_values.assign(v + numbers, v + size);
  return combine_chunk_stats(plan_, grads, v);
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
