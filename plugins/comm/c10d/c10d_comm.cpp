// Rendezvous, collectives and lost-rank diagnosis shared by the gloo and nccl comm plugins.
#include "c10d_comm.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Logging.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
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

// Whether something accepts TCP connections at host:port before `deadline`, trying every 100 ms.
// c10d's own connect retries for two rounds of its timeout, growing with it (373 s against a
// --dist-timeout of 300); this wait is the rendezvous's bound for a port nobody serves. An address
// that does not resolve is left to c10d, whose message names it.
bool listener_before(const std::string& host, int port, std::chrono::steady_clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr)
    return true;
  bool accepted = false;
  while (!accepted && std::chrono::steady_clock::now() < deadline) {
    for (const addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        accepted = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int error = 0;
        socklen_t length = sizeof error;
        accepted = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
                   error == 0;
      }
      ::close(fd);
    }
    if (!accepted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(found);
  return accepted;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

std::string heartbeat_key(int rank) {
  return "ampkit/heartbeat/" + std::to_string(rank);
}

// c10d logs each failed store call and socket error as a warning with a C++ stack trace (a lost
// rank 0 makes hundreds of them, about 1 MB, on every survivor's stderr); what matters is in the one
// line ampkit-train prints. Unless the user asked for LibTorch's log (TORCH_CPP_LOG_LEVEL), only
// fatal messages are printed.
void quiet_c10d_log() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr)
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 3);
}

// torchrun's agent hosts the TCP store itself and tells its workers to use it
// (TORCHELASTIC_USE_AGENT_STORE=True): then rank 0 is a client like the others.
bool agent_serves_the_store(const DistributedConfig& config) {
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return config.store == "tcp" && agent != nullptr && std::string(agent) == "True";
}

std::string read_value(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return "";
  const auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

// Which ranks' heartbeats stand still over `wait`; throws when the store does not answer.
std::vector<int> silent_ranks(c10d::Store& store, int rank, int world_size,
                              std::chrono::duration<double> wait) {
  std::vector<std::string> before(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r)
    if (r != rank) before[static_cast<size_t>(r)] = read_value(store, heartbeat_key(r));
  std::this_thread::sleep_for(wait);
  std::vector<int> lost;
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    const std::string now = read_value(store, heartbeat_key(r));
    if (now.empty() || now == before[static_cast<size_t>(r)]) lost.push_back(r);
  }
  return lost;
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
  options.isServer = config_.rank == 0 && !agent_store_;
  options.numWorkers = static_cast<std::size_t>(config_.world_size);
  options.waitWorkers = true;
  // A client's connect runs two rounds of its timeout (c10d's socket connect retries until the
  // timeout, and TCPStore retries that once more): 2.2-2.4 x --dist-timeout against a port nobody
  // serves. Half the timeout for the connect keeps the rendezvous within --dist-timeout; the full
  // timeout applies to every store call after it.
  options.timeout = options.isServer ? timeout() : timeout() / 2;
  try {
    if (!options.isServer && !listener_before(config_.master_addr, config_.master_port,
                                              std::chrono::steady_clock::now() + timeout()))
      throw std::runtime_error("nothing accepted a connection there within --dist-timeout " +
                               seconds_text(config_.timeout_seconds) +
                               " s (MASTER_ADDR and MASTER_PORT must name rank 0's store on every rank)");
    auto store = c10::make_intrusive<c10d::TCPStore>(config_.master_addr, options);
    store->setTimeout(timeout());
    if (!agent_store_) return store;
    // Under torchrun the agent serves the store on MASTER_PORT for every attempt; the workers'
    // keys live under this attempt's prefix (torch.distributed's _create_c10d_store does the same).
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::string(attempt != nullptr ? attempt : "0"), store);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous at " + config_.master_addr + ":" +
                             std::to_string(config_.master_port) + " failed (rank " +
                             std::to_string(config_.rank) + " of " + std::to_string(config_.world_size) +
                             (config_.rank == 0 ? ", hosting the store" : "") + "): " + first_line(e.what()));
  }
}

void C10dCommBackend::init(const DistributedConfig& config) {
  if (group_) throw std::runtime_error("comm '" + name() + "' initialised twice");
  quiet_c10d_log();
  config_ = config;
  agent_store_ = agent_serves_the_store(config_);
  store_ = make_store();
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("ampkit/pg/", store_);
  backend_ = make_backend(group_store, config_);
  group_ = c10::make_intrusive<c10d::ProcessGroup>(group_store, config_.rank, config_.world_size);
  for (c10::DeviceType type : device_types()) group_->setBackend(type, backend_type(), backend_);
  group_->setDefaultBackend(backend_type());
  if (config_.world_size > 1) {
    c10::intrusive_ptr<c10d::Store> beat_store = store_->clone();
    beat_store->set(heartbeat_key(config_.rank), "0");
    // The connection a diagnosis reads heartbeats on is made now, while the store answers: a
    // clone made after a failure would reconnect to a dead store for the whole --dist-timeout.
    probe_store_ = store_->clone();
    probe_store_->setTimeout(
        std::chrono::milliseconds(static_cast<int64_t>(1000 * (2 + 2 * heartbeat_seconds_))));
    heartbeat_ = std::thread([this, beat_store] { heartbeat_loop(beat_store); });
  }
}

void C10dCommBackend::heartbeat_loop(c10::intrusive_ptr<c10d::Store> store) {
  int64_t beat = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::duration<double>(heartbeat_seconds_),
                         [this] { return stopping_; })) {
    lock.unlock();  // a store call can take up to the timeout: never with the lock held
    try {
      store->set(heartbeat_key(config_.rank), std::to_string(++beat));
    } catch (const std::exception&) {
      // The store's host (rank 0) is gone or finishing; the collectives report it, not this
      // thread. A TCP store that failed once does not come back: no more beats (and no retries).
      return;
    }
    lock.lock();
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

at::Tensor C10dCommBackend::all_gather(const at::Tensor& tensor) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> shape = {config_.world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor all = at::empty(shape, tensor.options());
  if (config_.world_size == 1) return all.copy_(tensor.unsqueeze(0));
  std::vector<at::Tensor> input = {tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < config_.world_size; ++r) output[0].push_back(all[r]);  // views: written in place
  backend_->allgather(output, input, c10d::AllgatherOptions{})->wait();
  return all;
}

void C10dCommBackend::barrier() {
  if (config_.world_size == 1) return;
  backend_->barrier(c10d::BarrierOptions{})->wait();
}

CommFailure C10dCommBackend::explain_failure(const std::string& what) {
  using Reason = CommFailure::Reason;
  const std::string cause = first_line(what);
  if (config_.world_size == 1 || !probe_store_) return {Reason::unknown, {}, cause};
  const auto wait = std::chrono::duration<double>(2.5 * heartbeat_seconds_);
  // Diagnosing must never block on a dead or stopped store: it runs in a thread of its own, and
  // after `wait` plus 1 + heartbeat_seconds the answer is "the store stopped answering", whatever
  // the store does (the process exits right after; the thread goes with it).
  auto found = std::make_shared<std::promise<std::vector<int>>>();
  std::future<std::vector<int>> lost_ranks = found->get_future();
  std::thread([found, store = probe_store_, rank = config_.rank, world = config_.world_size, wait] {
    try {
      found->set_value(silent_ranks(*store, rank, world, wait));
    } catch (...) {
      found->set_exception(std::current_exception());
    }
  }).detach();
  const auto bound = wait + std::chrono::duration<double>(1 + heartbeat_seconds_);
  std::vector<int> lost;
  bool store_answered = lost_ranks.wait_for(bound) == std::future_status::ready;
  if (store_answered) {
    try {
      lost = lost_ranks.get();
    } catch (...) {  // whatever the store threw: it did not answer
      store_answered = false;
    }
  }
  const std::string where = config_.master_addr + ":" + std::to_string(config_.master_port);
  if (!store_answered) {
    if (config_.store.rfind("file:", 0) == 0)
      return {
          Reason::store_stopped,
          {},
          "the rendezvous store " + config_.store.substr(5) + " stopped answering; " + name() + ": " + cause};
    if (agent_store_)
      return {Reason::store_stopped,
              {},
              "the rendezvous store of torchrun's agent at " + where +
                  " stopped answering (the agent or its node is gone); " + name() + ": " + cause};
    if (config_.rank != 0)
      return {Reason::lost_rank,
              {0},
              "lost rank 0 (it hosts the rendezvous store at " + where +
                  ", which stopped answering: killed, crashed, stopped or unreachable); " + name() + ": " +
                  cause};
    return {
        Reason::store_stopped,
        {},
        "the rendezvous store this rank hosts at " + where + " stopped answering; " + name() + ": " + cause};
  }
  // Rank 0 keeps serving the store a little longer, so the other survivors can diagnose too.
  if (config_.rank == 0 && !agent_store_) std::this_thread::sleep_for(wait);
  if (lost.empty())
    return {Reason::ranks_alive,
            {},
            "a collective failed but every rank still sends heartbeats (a rank may be stuck in its own "
            "work, or the ranks disagree on the step); " +
                name() + ": " + cause};
  std::string ranks;
  for (const int r : lost) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  char silent[32];
  std::snprintf(silent, sizeof silent, "%.1f", 2.5 * heartbeat_seconds_);
  return {Reason::lost_rank, lost,
          std::string(lost.size() == 1 ? "lost rank " : "lost ranks ") + ranks + " (no heartbeat for " +
              silent + " s: killed, crashed or hung); " + name() + ": " + cause};
}

}  // namespace ampkit::comm
