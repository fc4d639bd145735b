// Comm "local": one process, no communication; the collectives are identities.
#include <ampkit/comm_plugin.h>

#include <stdexcept>

namespace {

class LocalCommBackend final : public ampkit::CommBackend {
 public:
  explicit LocalCommBackend(const ampkit::OptionValues&) {}
  void init(const ampkit::DistributedConfig& config) override {
    if (config.world_size != 1)
      throw std::runtime_error("comm 'local' runs one process but world_size is " +
                               std::to_string(config.world_size) + "; use comm 'gloo' or 'nccl'");
  }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_mean(std::vector<at::Tensor>&) override {}
  void broadcast(std::vector<at::Tensor>&, int) override {}
  at::Tensor all_gather(const at::Tensor& tensor) override { return tensor.unsqueeze(0).clone(); }
  void barrier() override {}
  void* find_function(const char* name) override {
    return ampkit::offer_comm_facts<ampkit::kCommStateEmpty>(name);
  }
};

}  // namespace

AMPKIT_PLUGIN(comm, local, LocalCommBackend, "Single process: no communication")
