// The deferred step (deferred_step.h): decisions on the device, figures delivered to the host late.
#include "ampkit/deferred_step.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/host_reads.h"
#include "ampkit/kernel_check.h"
#include "ampkit/plugin_description.h"
#include "cuda/step_rules_abi.h"
#include "stream_use.h"

namespace ampkit {

namespace {

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// "scaler 'dynamic' 0.1.0 (/x/...so)" for a guarded strategy (plugin_description.h), else its kind.
std::string plugin_of(Strategy& strategy, const char* kind) {
  const void* description = strategy.find_function(kPluginDescriptionQuery);
  return description != nullptr ? static_cast<const char*>(description) : std::string("the ") + kind;
}

// The host forms' decisions on a delivered record against the device's (`v`). An abort the host
// forms decided stops the run as on the synchronous step, whatever the device did: the strategy
// asked for it. Any other difference is the fault of the plugin whose host form and declared device
// rule part (device_rules.h): the scaler's scales, the NaN policy's fate of the step, the clipper's
// coefficient. Opened, the iteration has no scaler update yet: a scaler's own abort (at its
// minimum scale) comes with the caller's finish, and the next scale is the host forms' from then on.
void check_agreement(const AmpStrategies& s, const StepOutcome& done, const double* v, double host_scale,
                     bool open) {
  if (done.decision.action == NanAction::abort) return;
  const bool device_abort = v[AMPKIT_RECORD_ABORT] > 0;
  std::string who;
  if (host_scale != v[AMPKIT_RECORD_SCALE])
    who = plugin_of(*s.scaler, "loss scaler");
  else if (device_abort && !open)
    who = plugin_of(*s.nan_policy, "NaN policy") + " or " + plugin_of(*s.scaler, "loss scaler");
  else if (done.stepped != (v[AMPKIT_RECORD_STEPPED] > 0) ||
           (!(open && device_abort) &&
            (done.decision.action == NanAction::skip_backoff) != (v[AMPKIT_RECORD_BACKOFF] > 0)))
    who = plugin_of(*s.nan_policy, "NaN policy");
  else if (!same_bits(done.clip_coefficient, v[AMPKIT_RECORD_COEFFICIENT]))
    who = plugin_of(*s.clipper, "gradient clipper");
  else if (!open && done.scale_next != v[AMPKIT_RECORD_SCALE_NEXT])
    who = plugin_of(*s.scaler, "loss scaler");
  else
    return;
  char text[512];
  std::snprintf(text, sizeof text,
                ": its host form and the device rule it declares disagree at deferred step %lld: the device "
                "decided scale %.9g, stepped %g, backoff %g, abort %g, clip coefficient %.17g, next scale "
                "%.9g; the host forms scale %.9g, action %s, clip coefficient %.17g, next scale %.9g",
                static_cast<long long>(done.stats.step), v[AMPKIT_RECORD_SCALE], v[AMPKIT_RECORD_STEPPED],
                v[AMPKIT_RECORD_BACKOFF], v[AMPKIT_RECORD_ABORT], v[AMPKIT_RECORD_COEFFICIENT],
                v[AMPKIT_RECORD_SCALE_NEXT], host_scale, to_string(done.decision.action),
                done.clip_coefficient, done.scale_next);
  throw Error(ErrorCategory::plugin, who + text);
}

}  // namespace

struct DeferredStep::Pending {
  at::Tensor host;                    // the record, in (pinned) host memory once `ready` has passed
  std::unique_ptr<c10::Event> ready;  // CUDA: the copy's completion; CPU: none
  int64_t elements = 0;  // without a reduction; with one, the record's AMPKIT_RECORD_GROUP_ELEMENTS
  bool reduced = false;
  bool has_loss = false;
  bool tensor_norms = false;
  DeviceTotals totals;  // with tensor_norms: the per-gradient sums' sources (chunk sums copied to the host)
};

DeferredStep::DeferredStep(AmpStep& step, std::unique_ptr<DeviceStepRules> rules)
    : step_(step), rules_(std::move(rules)), scale_(rules_->scale().clone()) {}

DeferredStep::~DeferredStep() = default;

std::unique_ptr<DeferredStep> DeferredStep::make(AmpStep& step, const GradientTable& table, std::string& kind,
                                                 std::string& why) {
  kind.clear();
  at::Device device(at::kCPU);
  for (const auto& p : table.parameters())
    if (p.defined()) {
      device = p.device();
      break;
    }
  // First: where the kernels (their CPU stand-ins on the CPU) failed to load or check, that is the
  // reason, also behind a statistics recipe that fell back for it.
  why = kernel_refusal(device);
  if (!why.empty()) return nullptr;
  // A GPU in a build without ampkit's kernels (no nvcc of LibTorch's CUDA version): as where they
  // were refused, the step stays synchronous; the statistics recipe said why once already.
  if (!DeviceStepRules::runs_on(device)) {
    why = "this build has no rules kernel for " + device.str() +
          " (it was built without an nvcc of LibTorch's CUDA version)";
    return nullptr;
  }
  if (table.recipe() != DeviceStatsRecipe::chunk_kernel && table.recipe() != DeviceStatsRecipe::fused_scan) {
    why = std::string("the ") + to_string(table.recipe()) + " statistics recipe has no deferred form";
    return nullptr;
  }
  const AmpStrategies& s = step.strategies();
  auto rules = DeviceStepRules::of(*s.scaler, *s.clipper, *s.nan_policy, kind);
  if (!rules) {
    why = "has no device form";
    return nullptr;
  }
  rules->start(*s.scaler, device, step.counters().consecutive_skips);
  return std::unique_ptr<DeferredStep>(new DeferredStep(step, std::move(rules)));
}

void DeferredStep::allow_graphs(int64_t ring_rows) {
  if (begun_) throw Error(ErrorCategory::internal, "DeferredStep::allow_graphs after the first step");
  if (ring_rows < 1) throw Error(ErrorCategory::internal, "DeferredStep::allow_graphs: at least one row");
  ring_rows_ = ring_rows;
}

DeferredGradients DeferredStep::after_backward(GradientTable& table, const at::Tensor& loss, bool capturing) {
  if (!broken_.empty()) throw Error(ErrorCategory::usage, broken_);
  if (capturing && ring_rows_ == 0)
    throw Error(ErrorCategory::internal, "a deferred step captured in a CUDA graph without allow_graphs()");
  if (capturing && !begun_)
    throw Error(ErrorCategory::usage,
                "a CUDA graph captures the deferred step only after it has run once uncaptured (warm up "
                "with at least one deferred iteration before the capture)");
  if (capturing && tensor_norms_)
    throw Error(ErrorCategory::internal, "per-gradient norms do not ride a CUDA graph's records");
  begun_ = true;
  in_graph_ = in_graph_ || capturing;
  if (!in_graph_) {  // kept for the next deliver(), which returns them first
    for (StepOutcome& o : deliver(false)) held_.push_back(std::move(o));
    while (pending_.size() > 1) {  // the step before last: waited for, so nothing lags more than one step
      std::unique_ptr<Pending> oldest = std::move(pending_.front());
      pending_.pop_front();
      deliver_into(*oldest, held_);
    }
  }
  std::vector<at::Tensor> scalars;
  if (loss.defined()) scalars.push_back(loss);
  const DeviceTotals t = table.measure_on_device(scalars, tensor_norms_, capturing);
  auto p = std::make_unique<Pending>();
  p->elements = t.elements;
  p->reduced = t.group_elements.defined();
  p->has_loss = loss.defined();
  p->tensor_norms = tensor_norms_;
  if (tensor_norms_) {
    p->totals.tensor_sum_squares = t.tensor_sum_squares;
    p->totals.chunk_tensors = t.chunk_tensors;
    p->totals.tensors = t.tensors;
  }
  if (in_graph_) check_ring_shape(*p);  // before the rules change the device's state
  const at::Tensor loss_value = loss.defined() ? t.scalars.select(0, 0) : at::Tensor();
  // 4-8 in one call: on the host for CPU tensors, one kernel on a GPU.
  const DeviceStepResult r =
      rules_->step({t.sum_squares, t.max_abs, t.zeros, loss_value, t.group_elements}, scale_);
  const DeferredGradients out{r.grad_scale, r.found_inf, r.stepped};
  const at::Tensor& record = r.record;
  if (ring_rows_ > 0 && !ring_.defined()) {  // outside any graph (the first step is never captured)
    ring_ = at::empty({ring_rows_, AMPKIT_RECORD_GROUP_ELEMENTS + 1}, record.options());
    ring_written_ = at::zeros({}, record.options().dtype(at::kLong));
  }
  for (const at::Tensor* kept : {&scale_, &ring_, &ring_written_}) mark_used_on_current_stream(*kept);
  if (in_graph_) {
    write_ring(record);
    return out;
  }
  const bool chunks = tensor_norms_ && t.chunk_sum_squares.defined();
  if (record.is_cpu()) {
    p->host = record;
    if (chunks)
      p->totals.chunk_sum_squares = t.chunk_sum_squares.contiguous().clone();  // the buffer is reused
  } else {  // queued behind this step's work; the host reads it once the event has passed
    const auto pinned = at::TensorOptions().dtype(at::kDouble).pinned_memory(true);
    p->host = at::empty({record.numel()}, pinned);
    p->host.copy_(record, /*non_blocking=*/true);
    if (chunks) {
      p->totals.chunk_sum_squares = at::empty({t.chunk_sum_squares.numel()}, pinned);
      p->totals.chunk_sum_squares.copy_(t.chunk_sum_squares, /*non_blocking=*/true);
    }
    p->ready = std::make_unique<c10::Event>(record.device().type());
    p->ready->record(c10::impl::VirtualGuardImpl(record.device().type()).getStream(record.device()));
  }
  pending_.push_back(std::move(p));
  return out;
}

std::vector<StepOutcome> DeferredStep::deliver(bool wait, Newest newest) {
  if (!broken_.empty()) throw Error(ErrorCategory::usage, broken_);
  if (!wait && newest != Newest::deliver)
    throw Error(ErrorCategory::internal, "DeferredStep::deliver: the newest record is known only with wait");
  std::vector<StepOutcome> delivered = std::move(held_);
  held_.clear();
  // The ring's rows come after the queue (its steps ran first): the count, one host read.
  if (wait && in_graph_) wait_for_every_stream(ring_written_);  // replays on any stream, not only ours
  const int64_t written = wait && in_graph_ ? static_cast<int64_t>(read_scalar(ring_written_)) : ring_read_;
  while (!pending_.empty()) {
    const Pending& front = *pending_.front();
    if (!wait && (front.ready ? !front.ready->query() : late_arrivals_)) break;
    const bool last = pending_.size() == 1 && written == ring_read_;
    if (last && newest == Newest::hold) break;
    std::unique_ptr<Pending> p = std::move(pending_.front());
    pending_.pop_front();
    deliver_into(*p, delivered, last && newest == Newest::open);
  }
  if (written != ring_read_) deliver_ring(delivered, written, newest);
  if (aborted_) ring_read_ = written;  // a held row after an abort is dropped too: nothing is left unread
  return delivered;
}

// After an abort the device applies no step (its rules refuse them) and the host forms stop at the
// aborting one: later records are read and dropped.
void DeferredStep::deliver_into(Pending& p, std::vector<StepOutcome>& delivered, bool open) {
  if (aborted_) return;
  if (p.ready) p.ready->synchronize();
  aborted_ = p.host.data_ptr<double>()[AMPKIT_RECORD_ABORT] > 0;
  StepOutcome done = deliver_one(p, open);
  aborted_ = aborted_ || done.decision.action == NanAction::abort;  // the host forms' own abort
  if (!open) delivered.push_back(std::move(done));  // opened: its iteration is the caller's to finish
}

// Every ring row is read as one shape (the elements, a reduction, a loss): the captured step's.
void DeferredStep::check_ring_shape(const Pending& shape) {
  if (!ring_shape_) {
    ring_shape_ = std::make_unique<Pending>();
    ring_shape_->elements = shape.elements;
    ring_shape_->reduced = shape.reduced;
    ring_shape_->has_loss = shape.has_loss;
  } else if (ring_shape_->elements != shape.elements || ring_shape_->reduced != shape.reduced ||
             ring_shape_->has_loss != shape.has_loss) {
    throw Error(ErrorCategory::usage,
                "a deferred step after a CUDA graph capture must measure what the captured one measured: " +
                    std::to_string(shape.elements) + " gradient elements " +
                    (shape.has_loss ? "with" : "without") + " a loss, where the capture had " +
                    std::to_string(ring_shape_->elements) + (ring_shape_->has_loss ? " with" : " without") +
                    " one");
  }
}

// The record to the ring's row (written count mod rows), then the count up by one: ATen operators
// on the device, whose arguments do not change between replays.
void DeferredStep::write_ring(const at::Tensor& record) {
  const at::Tensor row = at::remainder(ring_written_, ring_rows_).reshape({1});
  ring_.narrow(1, 0, record.numel()).index_copy_(0, row, record.reshape({1, -1}));
  ring_written_.add_(1);
}

int64_t DeferredStep::unread_rows() const {
  if (!ring_.defined()) return 0;
  wait_for_every_stream(ring_written_);
  return static_cast<int64_t>(read_scalar(ring_written_)) - ring_read_;
}

// The rows written since the last read (`written`: the count deliver() read), in order, the newest
// as `newest` says: one more host read.
void DeferredStep::deliver_ring(std::vector<StepOutcome>& delivered, int64_t written, Newest newest) {
  const int64_t unread = written - ring_read_;
  if (unread > ring_rows_) {
    broken_ = std::to_string(unread) +
              " deferred steps ran since their records were last read, more than the " +
              std::to_string(ring_rows_) + " rows of a CUDA graph's record ring: the oldest " +
              std::to_string(unread - ring_rows_) +
              " were overwritten, and the host state cannot follow the device's any more (read the host "
              "state, e.g. get_scale(), at least every " +
              std::to_string(ring_rows_) + " replays)";
    throw Error(ErrorCategory::usage, broken_);
  }
  const int64_t take = newest == Newest::hold ? unread - 1 : unread;
  if (take <= 0) return;
  const at::Tensor index =
      at::remainder(at::arange(ring_read_, ring_read_ + take, ring_written_.options()), ring_rows_);
  const at::Tensor rows = read_to_host(ring_.index_select(0, index)).contiguous();
  for (int64_t i = 0; i < take; ++i) {
    Pending p;
    p.host = rows.select(0, i);
    p.elements = ring_shape_->elements;
    p.reduced = ring_shape_->reduced;
    p.has_loss = ring_shape_->has_loss;
    ++ring_read_;
    deliver_into(p, delivered, i + 1 == take && newest == Newest::open);
  }
}

// The record given to the host forms (AmpStep::deliver), whose decisions must be the device's.
StepOutcome DeferredStep::deliver_one(Pending& p, bool open) {  // deliver_into has waited for its copy
  const double* v = p.host.data_ptr<double>();
  StepOutcome out;
  StepStats& st = out.stats;
  st.loss = p.has_loss ? v[AMPKIT_RECORD_LOSS] : 0.0;
  st.loss_finite = std::isfinite(st.loss);
  st.scale = v[AMPKIT_RECORD_SCALE];
  const double sum = v[AMPKIT_RECORD_SUM_SQUARES];
  st.grad_norm_scaled = std::sqrt(sum);
  st.grad_norm = st.grad_norm_scaled / st.scale;
  st.grad_max_abs_scaled = std::isnan(sum) ? std::nan("") : v[AMPKIT_RECORD_MAX_ABS];
  st.grad_max_abs = st.grad_max_abs_scaled / st.scale;
  st.grad_elements = p.reduced ? static_cast<int64_t>(v[AMPKIT_RECORD_GROUP_ELEMENTS]) : p.elements;
  st.zero_fraction = st.grad_elements ? v[AMPKIT_RECORD_ZEROS] / static_cast<double>(st.grad_elements) : 0.0;
  st.found_inf = !st.loss_finite || !std::isfinite(sum) || std::isnan(v[AMPKIT_RECORD_MAX_ABS]);
  if (p.tensor_norms) {  // as AmpStep's measure makes them from the same sums
    const at::Tensor& chunk_sums = p.totals.chunk_sum_squares;
    for (const double s :
         tensor_sums(p.totals, chunk_sums.defined() ? chunk_sums.data_ptr<double>() : nullptr))
      st.tensor_norms.push_back(std::sqrt(s) / st.scale);
  }
  const double host_scale = step_.scale();
  const StepOutcome done = open ? step_.deliver_open(out) : step_.deliver(out);
  check_agreement(step_.strategies(), done, v, host_scale, open);
  return done;
}

}  // namespace ampkit
