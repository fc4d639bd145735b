// The strategy wrappers of guarded_strategies.h: one per interface, each call inside a PluginCall.
#include "guarded_strategies.h"

#include <ampkit/comm_backend.h>
#include <ampkit/device_rules.h>
#include <ampkit/fp8_recipe.h>
#include <ampkit/grad_clipper.h>
#include <ampkit/kinds.h>
#include <ampkit/loss_scaler.h>
#include <ampkit/nan_policy.h>
#include <ampkit/options.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/plugin_call.h"
#include "ampkit/plugin_description.h"

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

  // A value handed back that the host cannot act on is the plugin's fault, refused here, before the
  // engine or a host uses it: one line naming the plugin, the call and the value.
  [[noreturn]] void refuse(const char* call, const std::string& value, const std::string& rule) const {
    throw Error(ErrorCategory::plugin, description + " answered " + value + " from " + call + ": " + rule);
  }
};

// start/save/load, for every wrapper.
#define AMPKIT_GUARD_STRATEGY_CALLS                                                          \
  void start(const RunInfo& info) override {                                                 \
    g_.run("start()", [&] { g_.inner->start(info); });                                       \
  }                                                                                          \
  State save() const override {                                                              \
    return g_.run("save()", [&] { return g_.inner->save(); });                               \
  }                                                                                          \
  void load(const State& state) override {                                                   \
    g_.run("load()", [&] { g_.inner->load(state); });                                        \
  }                                                                                          \
  void* find_function(const char* name) override {                                           \
    if (is_plugin_description_query(name)) return const_cast<char*>(g_.description.c_str()); \
    return g_.run("find_function()", [&] { return g_.inner->find_function(name); });         \
  }

class GuardedScaler final : public LossScaler {
 public:
  explicit GuardedScaler(Guard g) : g_(std::move(g)), s_(static_cast<LossScaler&>(*g_.inner)) {
    // Bounds a scaler declares (its dynamic device rule's): asked once, the pointer lives with it.
    const auto* rule = static_cast<const ScalerDeviceRule*>(
        g_.run("find_function()", [&] { return s_.find_function(kScalerDeviceRule); }));
    if (rule != nullptr && rule->struct_size >= kScalerDeviceRuleFirstSize &&
        rule->kind == ScalerDeviceRule::Kind::dynamic)
      bounds_ = rule;
  }
  AMPKIT_GUARD_STRATEGY_CALLS
  // A scale of 0 would take a step on gradients of 0 / 0, a negative one train backwards, a
  // non-finite one skip every step: none is trained with.
  double scale() const override {
    const double s = g_.run("scale()", [&] { return s_.scale(); });
    if (!(s > 0.0) || !std::isfinite(s))
      g_.refuse("scale()", format_number(s), "a loss scale must be finite and > 0");
    if (bounds_ != nullptr && (s < bounds_->min_scale || s > bounds_->max_scale))
      g_.refuse("scale()", format_number(s),
                "outside the bounds [" + format_number(bounds_->min_scale) + ", " +
                    format_number(bounds_->max_scale) + "] its device rule declares");
    return s;
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
  const ScalerDeviceRule* bounds_ = nullptr;
};

class GuardedClipper final : public GradClipper {
 public:
  explicit GuardedClipper(Guard g) : g_(std::move(g)), c_(static_cast<GradClipper&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  // The gradients are multiplied by the coefficient: 0 or less would wipe or flip them, more than 1
  // would amplify them, NaN would destroy them.
  ClipResult clip(const StepStats& stats) override {
    const ClipResult r = g_.run("clip()", [&] { return c_.clip(stats); });
    if (!(r.coefficient > 0.0 && r.coefficient <= 1.0))
      g_.refuse("clip()", "clip coefficient " + format_number(r.coefficient), "it must lie in (0, 1]");
    if (!(r.threshold >= 0.0))
      g_.refuse("clip()", "threshold " + format_number(r.threshold), "a clip threshold must be >= 0");
    return r;
  }
  bool clips_elementwise() const override {
    return g_.run("clips_elementwise()", [&] { return c_.clips_elementwise(); });
  }
  double clip_unscaled_gradients(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& unscaled_grads) override {
    const double ratio = g_.run("clip_unscaled_gradients()",
                                [&] { return c_.clip_unscaled_gradients(parameters, unscaled_grads); });
    if (!(ratio >= 0.0) || !std::isfinite(ratio))
      g_.refuse("clip_unscaled_gradients()", "norm ratio " + format_number(ratio),
                "the ratio of the norms after and before must be finite and >= 0");
    return ratio;
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
    NanDecision d = g_.run("decide()", [&] { return p_.decide(stats); });
    check(d);
    return d;
  }
  RollbackPlan rollback_plan() const override {
    return g_.run("rollback_plan()", [&] { return p_.rollback_plan(); });
  }

 private:
  // An action the host knows and can carry out: a rollback needs the snapshots a declared plan
  // makes the host keep; a clip needs a norm to clip to.
  void check(const NanDecision& d) const {
    using Number = std::underlying_type_t<NanAction>;
    const auto action = static_cast<Number>(d.action);
    if (action < static_cast<Number>(NanAction::proceed) || action > static_cast<Number>(NanAction::clip))
      g_.refuse("decide()", "action " + std::to_string(action),
                "not one of proceed, skip, skip_backoff, rollback, abort, clip");
    if (d.action == NanAction::rollback && !rollback_plan().enabled())
      g_.refuse("decide()", "rollback",
                "it declares no rollback plan (rollback_plan()), so no snapshot is kept to roll back to");
    if (d.action == NanAction::rollback && d.skip_batches < 0)
      g_.refuse("decide()", "rollback with skip_batches " + std::to_string(d.skip_batches),
                "it must be >= 0");
    if (d.action == NanAction::clip && (!(d.clip_norm > 0.0) || !std::isfinite(d.clip_norm)))
      g_.refuse("decide()", "clip with clip_norm " + format_number(d.clip_norm), "it must be finite and > 0");
  }

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

// The caller sizes its buffers by history_length() and casts by format() and the scales update()
// writes: each answer is checked where it leaves the plugin.
class GuardedFp8Recipe final : public Fp8Recipe {
 public:
  explicit GuardedFp8Recipe(Guard g) : g_(std::move(g)), r_(static_cast<Fp8Recipe&>(*g_.inner)) {}
  AMPKIT_GUARD_STRATEGY_CALLS
  int64_t history_length() const override {
    const int64_t w = g_.run("history_length()", [&] { return r_.history_length(); });
    if (w < 0) g_.refuse("history_length()", std::to_string(w), "a history length is 0 or more");
    return w;
  }
  bool current_scaling() const override {
    return g_.run("current_scaling()", [&] { return r_.current_scaling(); });
  }
  double current_eps() const override {
    const double eps = g_.run("current_eps()", [&] { return r_.current_eps(); });
    if (!(std::isfinite(eps) && eps >= 0))
      g_.refuse("current_eps()", std::to_string(eps), "eps is finite and >= 0");
    return eps;
  }
  const char* format(int64_t role) const override {
    const char* f = g_.run("format()", [&] { return r_.format(role); });
    if (fp8_format_max(f) == 0.0)
      g_.refuse("format()", f == nullptr ? "null" : "'" + std::string(f) + "'", "a format is e4m3 or e5m2");
    return f;
  }
  int64_t update(int64_t n, const int64_t* roles, const float* amax, float* history, float* scale) override {
    // Only the scales it wrote are its answers: one the caller handed in unchanged is the caller's.
    const std::vector<float> before(scale, scale + (n > 0 ? n : 0));
    const int64_t bad = g_.run("update()", [&] { return r_.update(n, roles, amax, history, scale); });
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&scale[i], &before[i], sizeof(float)) != 0 &&
          !(std::isfinite(scale[i]) && scale[i] > 0))
        g_.refuse("update()", "scale " + format_number(scale[i]) + " for tensor " + std::to_string(i),
                  "a scale is finite and > 0");
    if (bad < 0 || bad > n)
      g_.refuse("update()", std::to_string(bad) + " bad amaxes of " + std::to_string(n),
                "the count is between 0 and the number of tensors");
    return bad;
  }

 private:
  Guard g_;
  Fp8Recipe& r_;
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
  if (kind == "fp8_recipe") return std::make_unique<GuardedFp8Recipe>(std::move(g));
  return std::make_unique<GuardedComm>(std::move(g));
}

}  // namespace ampkit
