// A StatsReduction over a c10d process group: one all_gather per statistics pass (FSDP2's shards).
#include "group_reduction.h"

#include <ATen/Functions.h>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>

#include "ampkit/error.h"

namespace ampkit::python {

namespace {

class GroupReduction final : public StatsReduction {
 public:
  GroupReduction(c10::intrusive_ptr<c10d::ProcessGroup> group, GradientLayout layout)
      : group_(std::move(group)), layout_(layout) {}

  // torch's GradScaler reduces found_inf as a maximum over the mesh and clip_grad_norm_ the norms
  // of a DTensor's shards as a sum of squares; one all_gather carries both, and the loss.
  at::Tensor reduce(const at::Tensor& local) override {
    const int64_t ranks = group_->getSize(), count = local.numel();
    at::Tensor input = local.contiguous();
    at::Tensor gathered = at::empty({ranks * count}, input.options());
    group_->_allgather_base(gathered, input)->wait();  // on a GPU: the stream waits, not the host
    const at::Tensor rows = gathered.view({ranks, count});
    const at::Tensor sums = rows.sum(0), maxima = rows.amax(0);  // amax propagates NaN
    at::Tensor out = (layout_ == GradientLayout::shards ? sums : maxima).clone();
    out.narrow(0, kMaxAbs, 1).copy_(maxima.narrow(0, kMaxAbs, 1));
    // The scalars' mean, divided by a tensor on their device: CUDA multiplies by the reciprocal of a
    // plain-number divisor, which is not the correctly rounded quotient a CPU gives.
    const at::Tensor divisor = at::scalar_tensor(static_cast<double>(ranks), sums.options());
    out.narrow(0, kFields, count - kFields).copy_(sums.narrow(0, kFields, count - kFields).div(divisor));
    return out;
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  GradientLayout layout_;
};

}  // namespace

std::shared_ptr<StatsReduction> make_group_reduction(const std::string& group_name, GradientLayout layout) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(group_name);
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::usage, "no process group named '" + group_name +
                                          "' is registered with c10d (" +
                                          std::string(e.what()).substr(0, 200) + ")");
  }
  return std::make_shared<GroupReduction>(std::move(group), layout);
}

}  // namespace ampkit::python
