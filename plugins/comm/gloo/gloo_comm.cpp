// Comm "gloo": c10d's Gloo process group over TCP; CPU tensors (and CUDA tensors, staged by Gloo).
#include <cstdlib>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "../c10d/c10d_comm.h"

namespace {

class GlooCommBackend final : public ampkit::comm::C10dCommBackend {
 public:
  explicit GlooCommBackend(const ampkit::OptionValues& options)
      : C10dCommBackend(options), interface_(options.get_string("socket_ifname")) {}
  void* find_function(const char* name) override {
    return ampkit::offer_comm_facts<ampkit::kCommMultiProcess | ampkit::kCommStateEmpty>(name);
  }

 protected:
  c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const ampkit::DistributedConfig& config) override {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout());
    std::string interface = interface_;
    if (interface.empty())
      if (const char* env = std::getenv("GLOO_SOCKET_IFNAME")) interface = env;
    // Without an interface Gloo binds to the address this host's name resolves to (or loopback).
    options->devices.push_back(interface.empty()
                                   ? c10d::ProcessGroupGloo::createDefaultDevice()
                                   : c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, config.rank, config.world_size, options);
  }
  c10d::ProcessGroup::BackendType backend_type() const override { return c10d::ProcessGroup::GLOO; }
  std::vector<c10::DeviceType> device_types() const override { return {c10::kCPU, c10::kCUDA}; }
  std::string name() const override { return "gloo"; }

 private:
  std::string interface_;
};

}  // namespace

AMPKIT_PLUGIN(comm, gloo, GlooCommBackend,
              "Gloo process group over TCP (CPU training; multi-node via a TCPStore or FileStore)",
              AMPKIT_C10D_COMM_OPTIONS,
              ampkit::OptionSpec::String("socket_ifname", "",
                                         "Network interface Gloo binds to (e.g. eth0); empty: "
                                         "GLOO_SOCKET_IFNAME, else the address of this host's name."))
