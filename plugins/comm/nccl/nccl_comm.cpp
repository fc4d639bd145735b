// Comm "nccl": c10d's NCCL process group; CUDA tensors, one GPU per rank.
#include <c10/cuda/CUDAFunctions.h>

#include <stdexcept>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "../c10d/c10d_comm.h"

namespace {

class NcclCommBackend final : public ampkit::comm::C10dCommBackend {
 public:
  explicit NcclCommBackend(const ampkit::OptionValues& options)
      : C10dCommBackend(options), high_priority_(options.get_bool("high_priority_stream")) {}
  void* find_function(const char* name) override {
    return ampkit::offer_comm_facts<ampkit::kCommMultiProcess | ampkit::kCommNeedsCuda |
                                    ampkit::kCommStateEmpty>(name);
  }

  void init(const ampkit::DistributedConfig& config) override {
    const int devices = static_cast<int>(c10::cuda::device_count());
    if (devices == 0)
      throw std::runtime_error("comm 'nccl' needs a CUDA device and none is visible; use comm 'gloo' on CPU");
    const int device = config.device_ids.empty() ? config.local_rank : config.device_ids.front();
    if (device < 0 || device >= devices)
      throw std::runtime_error("comm 'nccl': rank " + std::to_string(config.rank) + " wants CUDA device " +
                               std::to_string(device) + " but " + std::to_string(devices) +
                               " are visible (check --device-ids / LOCAL_RANK / CUDA_VISIBLE_DEVICES)");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    C10dCommBackend::init(config);
  }

 protected:
  c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const ampkit::DistributedConfig& config) override {
    auto options = c10d::ProcessGroupNCCL::Options::create(high_priority_);
    options->timeout = timeout();
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, config.rank, config.world_size, options);
  }
  c10d::ProcessGroup::BackendType backend_type() const override { return c10d::ProcessGroup::NCCL; }
  std::vector<c10::DeviceType> device_types() const override { return {c10::kCUDA}; }
  std::string name() const override { return "nccl"; }

 private:
  bool high_priority_;
};

}  // namespace

AMPKIT_PLUGIN(comm, nccl, NcclCommBackend, "NCCL process group: CUDA tensors, one GPU per rank",
              AMPKIT_C10D_COMM_OPTIONS,
              ampkit::OptionSpec::Bool("high_priority_stream", "false",
                                       "Run NCCL kernels on high-priority CUDA streams."))
