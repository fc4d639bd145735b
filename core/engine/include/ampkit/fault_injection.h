// Fault injection for tests and demos: a NaN, an inf or a spike planted in one module's output or
// gradient, or in the loss, at one optimizer step (ampkit-train spells them --inject, in
// hosts/train/src/config/fault_spec.h).
#pragma once

#include <ampkit/forward_hook.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace ampkit {

struct Fault {
  enum class Kind { nan, inf, spike };
  enum class Target { output, grad };
  Kind kind = Kind::nan;
  int64_t step = 0;   // optimizer step (attempted, from 0)
  std::string layer;  // module path; empty: the loss itself
  int rank = -1;      // -1: every rank
  Target target = Target::output;
  double factor = 1000;  // spike: multiplier of the output or gradient
  std::string spec;      // as the user gave it, for messages
};

// Applies the faults planted at one step on one rank: arm() before the step's forward passes,
// with a ForwardHookScope around each, and apply_to_loss() to each micro-batch's loss.
class FaultInjector final : public ForwardHook {
 public:
  explicit FaultInjector(std::vector<Fault> faults) : faults_(std::move(faults)) {}
  // Arms the faults of (step, rank); true when there is any (the step then needs a hook).
  bool arm(int64_t step, int rank);
  bool armed() const { return !armed_.empty(); }
  at::Tensor on_output(const std::string& module, const at::Tensor& input, at::Tensor output) override;
  at::Tensor apply_to_loss(at::Tensor loss) const;
  // Faults armed for this step whose module never reported an output.
  std::vector<Fault> unreached() const;
  // Every module that reported an output since arm().
  const std::set<std::string>& seen() const { return seen_; }

 private:
  std::vector<Fault> faults_;
  std::vector<const Fault*> armed_;
  std::set<std::string> seen_;
};

const char* to_string(Fault::Kind kind);

}  // namespace ampkit
