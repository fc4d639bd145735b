// The strategy wrappers of guarded_strategies.h: one per interface, each call inside a PluginCall.
#include "guarded_strategies.h"

#include <ampkit/comm_backend.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/kinds.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>

#include <exception>
#include <utility>

#include "ampkit/error.h"
#include "ampkit/plugin_call.h"

namespace ampkit {

namespace {

// What each wrapper shares: the wrapped strategy, its name (and number, plugin_id()) and its time
// limit.
struct Guard {
  std::unique_ptr<Strategy> inner;
  std::string description;
  int plugin;
  unsigned timeout;
  bool convert_exceptions;

  // Runs `body` (a call named `call`, a string literal) as a plugin call.
  template <class F>
  auto run(const char* call, F&& body) const -> decltype(body()) {
    PluginCall active(plugin, call, timeout);
    if (!convert_exceptions) return body();
    try {
      return body();
    } catch (const Error&) {
      throw;
    } catch (const TrainingAborted&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCategory::plugin, description + " failed in " + call + ": " + e.what());
    } catch (...) {
      throw Error(ErrorCategory::plugin,
                  description + " threw something that is not a std::exception in " + call);
    }
  }
};

// start/save/load, for every wrapper.
#define AMPKIT_GUARD_STRATEGY_CALLS                                                  \
  void start(const RunInfo& info) override {                                         \
    g_.run("start()", [&] { g_.inner->start(info); });                               \
  }                                                                                  \
  State save() const override {                                                      \
    return g_.run("save()", [&] { return g_.inner->save(); });                       \
  }                                                                                  \
  void load(const State& state) override {                                           \
    g_.run("load()", [&] { g_.inner->load(state); });                                \
  }                                                                                  \
  void* find_function(const char* name) override {                                   \
    return g_.run("find_function()", [&] { return g_.inner->find_function(name); }); \
  }

class GuardedScaler final : public LossScaler {
 public:
  explicit GuardedScaler(Guard g) : g_(std::move(g)), s_(static_cast<LossScaler&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  double scale() const override {
    return g_.run("scale()", [&] { return s_.scale(); });
  }
  void update(const StepStats& stats) override {
    g_.run("update()", [&] { s_.update(stats); });
  }
  void backoff() override {
    g_.run("backoff()", [&] { s_.backoff(); });
  }
  bool is_dynamic() const override {
    return g_.run("is_dynamic()", [&] { return s_.is_dynamic(); });
  }

 private:
  Guard g_;
  LossScaler& s_;
};

class GuardedClipper final : public GradClipper {
 public:
  explicit GuardedClipper(Guard g) : g_(std::move(g)), c_(static_cast<GradClipper&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  ClipResult clip(const StepStats& stats) override {
    return g_.run("clip()", [&] { return c_.clip(stats); });
  }
  bool clips_elementwise() const override {
    return g_.run("clips_elementwise()", [&] { return c_.clips_elementwise(); });
  }
  double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& unscaled_grads) override {
    return g_.run("clip_unscaled_gradients()",
                  [&] { return c_.clip_unscaled_gradients(parameters, unscaled_grads); });
  }

 private:
  Guard g_;
  GradClipper& c_;
};

class GuardedPolicy final : public NanPolicy {
 public:
  explicit GuardedPolicy(Guard g) : g_(std::move(g)), p_(static_cast<NanPolicy&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  NanDecision decide(const StepStats& stats) override {
    return g_.run("decide()", [&] { return p_.decide(stats); });
  }
  RollbackPlan rollback_plan() const override {
    return g_.run("rollback_plan()", [&] { return p_.rollback_plan(); });
  }

 private:
  Guard g_;
  NanPolicy& p_;
};

class GuardedComm final : public CommBackend {
 public:
  explicit GuardedComm(Guard g) : g_(std::move(g)), c_(static_cast<CommBackend&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  void init(const DistributedConfig& config) override {
    g_.run("init()", [&] { c_.init(config); });
  }
  int rank() const override {
    return g_.run("rank()", [&] { return c_.rank(); });
  }
  int world_size() const override {
    return g_.run("world_size()", [&] { return c_.world_size(); });
  }
  void all_reduce_mean(std::vector<at::Tensor>& tensors) override {
    g_.run("all_reduce_mean()", [&] { c_.all_reduce_mean(tensors); });
  }
  void broadcast(std::vector<at::Tensor>& tensors, int root) override {
    g_.run("broadcast()", [&] { c_.broadcast(tensors, root); });
  }
  at::Tensor all_gather(const at::Tensor& tensor) override {
    return g_.run("all_gather()", [&] { return c_.all_gather(tensor); });
  }
  void barrier() override {
    g_.run("barrier()", [&] { c_.barrier(); });
  }
  c10d::ProcessGroup* process_group() override {
    return g_.run("process_group()", [&] { return c_.process_group(); });
  }
  CommFailure explain_failure(const std::string& what) override {
    return g_.run("explain_failure()", [&] { return c_.explain_failure(what); });
  }

 private:
  Guard g_;
  CommBackend& c_;
};

#undef AMPKIT_GUARD_STRATEGY_CALLS

}  // namespace

std::unique_ptr<Strategy> guard_strategy(const std::string& kind, std::unique_ptr<Strategy> inner,
                                         const std::string& description, unsigned timeout_seconds) {
  const KindInfo* info = find_kind(kind);
  if (info == nullptr) throw Error(ErrorCategory::internal, "guard_strategy: unknown kind " + kind);
  const bool comm = kind == "comm";
  Guard g{std::move(inner), description, plugin_id(description), comm ? 0U : timeout_seconds, !comm};
  if (kind == "scaler") return std::make_unique<GuardedScaler>(std::move(g));
  if (kind == "clipper") return std::make_unique<GuardedClipper>(std::move(g));
  if (kind == "nan_policy") return std::make_unique<GuardedPolicy>(std::move(g));
  return std::make_unique<GuardedComm>(std::move(g));
}

}  // namespace ampkit
