// Planting injected faults (docs/troubleshooting-nan.md, "Fault injection"); the host parses them.
#include "ampkit/fault_injection.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ampkit/error.h"

namespace ampkit {

namespace {

// One element set to `value`: a realistic fault (one bad activation), differentiable elsewhere.
at::Tensor plant(const at::Tensor& t, double value) {
  if (t.numel() == 0) return t;
  at::Tensor mask = at::zeros(t.sizes(), t.options().dtype(at::kBool));
  mask.view(-1)[0].fill_(true);
  return t.masked_fill(mask, value);
}

at::Tensor apply(const Fault& f, const at::Tensor& t) {
  switch (f.kind) {
    case Fault::Kind::nan:
      return plant(t, std::numeric_limits<double>::quiet_NaN());
    case Fault::Kind::inf:
      return plant(t, std::numeric_limits<double>::infinity());
    case Fault::Kind::spike:
      return t * f.factor;
  }
  return t;
}

}  // namespace

const char* to_string(Fault::Kind kind) {
  return kind == Fault::Kind::nan ? "nan" : kind == Fault::Kind::inf ? "inf" : "spike";
}

bool FaultInjector::arm(int64_t step, int rank) {
  armed_.clear();
  seen_.clear();
  for (const auto& f : faults_)
    if (f.step == step && (f.rank < 0 || f.rank == rank)) armed_.push_back(&f);
  return !armed_.empty();
}

at::Tensor FaultInjector::on_output(const std::string& module, const at::Tensor& /*input*/,
                                    at::Tensor output) {
  seen_.insert(module);
  for (const Fault* f : armed_) {
    if (f->layer != module) continue;
    if (f->target == Fault::Target::output) {
      output = apply(*f, output);
    } else if (output.requires_grad()) {
      const Fault fault = *f;
      output.register_hook([fault](const at::Tensor& g) { return apply(fault, g); });
    }
  }
  return output;
}

at::Tensor FaultInjector::apply_to_loss(at::Tensor loss) const {
  for (const Fault* f : armed_)
    if (f->layer.empty()) loss = apply(*f, loss);
  return loss;
}

std::vector<Fault> FaultInjector::unreached() const {
  std::vector<Fault> out;
  for (const Fault* f : armed_)
    if (!f->layer.empty() && !seen_.count(f->layer)) out.push_back(*f);
  return out;
}

}  // namespace ampkit
