// Rendezvous, collectives and lost-rank diagnosis shared by the gloo and nccl comm plugins.
#include "c10d_comm.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ampkit::comm {

namespace {

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string heartbeat_key(int rank) {
  return "ampkit/heartbeat/" + std::to_string(rank);
}

}  // namespace

C10dCommBackend::C10dCommBackend(const OptionValues& options)
    : heartbeat_seconds_(options.get_float("heartbeat_seconds", 1.0)) {}

C10dCommBackend::~C10dCommBackend() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::chrono::milliseconds C10dCommBackend::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(config_.timeout_seconds * 1000.0));
}

c10::intrusive_ptr<c10d::Store> C10dCommBackend::make_store() {
  if (config_.store.rfind("file:", 0) == 0) {
    auto store = c10::make_intrusive<c10d::FileStore>(config_.store.substr(5), config_.world_size);
    store->setTimeout(timeout());
    return store;
  }
  if (config_.world_size == 1)  // nothing to meet: no port to bind (and collide on)
    return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(config_.master_port);
  options.isServer = config_.rank == 0;
  options.numWorkers = static_cast<std::size_t>(config_.world_size);
  options.waitWorkers = true;
  options.timeout = timeout();
  try {
    return c10::make_intrusive<c10d::TCPStore>(config_.master_addr, options);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous at " + config_.master_addr + ":" +
                             std::to_string(config_.master_port) + " failed (rank " +
                             std::to_string(config_.rank) + " of " + std::to_string(config_.world_size) +
                             (config_.rank == 0 ? ", hosting the store" : "") + "): " + first_line(e.what()));
  }
}

void C10dCommBackend::init(const DistributedConfig& config) {
  if (group_) throw std::runtime_error("comm '" + name() + "' initialised twice");
  config_ = config;
  store_ = make_store();
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("ampkit/pg/", store_);
  backend_ = make_backend(group_store, config_);
  group_ = c10::make_intrusive<c10d::ProcessGroup>(group_store, config_.rank, config_.world_size);
  for (c10::DeviceType type : device_types()) group_->setBackend(type, backend_type(), backend_);
  group_->setDefaultBackend(backend_type());
  if (config_.world_size > 1) {
    c10::intrusive_ptr<c10d::Store> beat_store = store_->clone();
    beat_store->set(heartbeat_key(config_.rank), "0");
    heartbeat_ = std::thread([this, beat_store] { heartbeat_loop(beat_store); });
  }
}

void C10dCommBackend::heartbeat_loop(c10::intrusive_ptr<c10d::Store> store) {
  int64_t beat = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::duration<double>(heartbeat_seconds_),
                         [this] { return stopping_; })) {
    try {
      store->set(heartbeat_key(config_.rank), std::to_string(++beat));
    } catch (const std::exception&) {
      // The store's host (rank 0) is gone or finishing; the collectives report it, not this thread.
    }
  }
}

void C10dCommBackend::flat_collective(
    std::vector<at::Tensor>& tensors,
    const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& run) {
  at::NoGradGuard no_grad;  // results are copied into parameters (leaves that require grad)
  std::map<std::string, std::vector<size_t>> groups;  // by dtype and device
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].defined())
      groups[std::string(c10::toString(tensors[i].scalar_type())) + "@" + tensors[i].device().str()]
          .push_back(i);
  for (const auto& [key, indices] : groups) {
    if (indices.size() == 1 && tensors[indices[0]].is_contiguous()) {  // in place, no copies
      std::vector<at::Tensor> one = {tensors[indices[0]]};
      run(one)->wait();
      continue;
    }
    std::vector<at::Tensor> parts;
    parts.reserve(indices.size());
    for (size_t i : indices) parts.push_back(tensors[i].reshape({-1}));
    std::vector<at::Tensor> flat = {at::cat(parts)};
    run(flat)->wait();
    int64_t offset = 0;
    for (size_t i : indices) {
      const int64_t n = tensors[i].numel();
      tensors[i].copy_(flat[0].narrow(0, offset, n).view(tensors[i].sizes()));
      offset += n;
    }
  }
}

void C10dCommBackend::all_reduce_mean(std::vector<at::Tensor>& tensors) {
  if (config_.world_size == 1) return;
  const double world = static_cast<double>(config_.world_size);
  flat_collective(tensors, [&](std::vector<at::Tensor>& flat) {
    c10d::AllreduceOptions options;  // the backend's own timeout (--dist-timeout) applies
    options.reduceOp = c10d::ReduceOp::SUM;
    auto work = backend_->allreduce(flat, options);
    work->wait();
    flat[0].div_(world);
    return work;
  });
}

void C10dCommBackend::broadcast(std::vector<at::Tensor>& tensors, int root) {
  if (config_.world_size == 1) return;
  flat_collective(tensors, [&](std::vector<at::Tensor>& flat) {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return backend_->broadcast(flat, options);
  });
}

void C10dCommBackend::barrier() {
  if (config_.world_size == 1) return;
  backend_->barrier(c10d::BarrierOptions{})->wait();
}

std::string C10dCommBackend::explain_failure(const std::string& what) {
  const std::string cause = first_line(what);
  if (config_.world_size == 1) return cause;
  const auto wait = std::chrono::duration<double>(2.5 * heartbeat_seconds_);
  std::vector<std::string> lost;
  try {
    c10::intrusive_ptr<c10d::Store> store = store_->clone();
    store->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(1000 * (2 + 2 * heartbeat_seconds_))));
    std::vector<std::string> before(config_.world_size);
    for (int r = 0; r < config_.world_size; ++r)
      if (r != config_.rank && store->check({heartbeat_key(r)})) {
        const auto v = store->get(heartbeat_key(r));
        before[r].assign(v.begin(), v.end());
      }
    std::this_thread::sleep_for(wait);
    for (int r = 0; r < config_.world_size; ++r) {
      if (r == config_.rank) continue;
      std::string now;
      if (store->check({heartbeat_key(r)})) {
        const auto v = store->get(heartbeat_key(r));
        now.assign(v.begin(), v.end());
      }
      if (now.empty() || now == before[r]) lost.push_back(std::to_string(r));
    }
  } catch (const std::exception&) {
    // The store lives in rank 0: unreachable store, lost rank 0.
    if (config_.rank != 0)
      return "lost rank 0 (it hosts the rendezvous store at " + config_.master_addr + ":" +
             std::to_string(config_.master_port) + ", which stopped answering); " + name() + ": " + cause;
  }
  // Rank 0 keeps serving the store a little longer, so the other survivors can diagnose too.
  if (config_.rank == 0) std::this_thread::sleep_for(wait);
  if (lost.empty())
    return "a collective failed but every rank still sends heartbeats (a rank may be stuck in its own "
           "work, or the ranks disagree on the step); " +
           name() + ": " + cause;
  std::string ranks;
  for (const auto& r : lost) ranks += (ranks.empty() ? "" : ", ") + r;
  char silent[32];
  std::snprintf(silent, sizeof silent, "%.1f", 2.5 * heartbeat_seconds_);
  return std::string(lost.size() == 1 ? "lost rank " : "lost ranks ") + ranks + " (no heartbeat for " +
         silent + " s: killed, crashed or hung); " + name() + ": " + cause;
}

}  // namespace ampkit::comm
