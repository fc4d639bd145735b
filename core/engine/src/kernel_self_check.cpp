// The verdict on ampkit's kernels per device (kernel_check.h): the module loads, then the first-use
// self-check runs each kernel on a crafted case set and compares it with its CPU-proven host form.
// CPU tensors run the same decision over the kernels' CPU stand-ins (chunk_stats_on_host, and the
// rules' scalar function), which is how the tests plant a failure without a GPU.
#include "kernel_self_check.h"

#include <ATen/Functions.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ampkit/error.h"
#include "ampkit/grad_stats_chunks.h"
#include "ampkit/kernel_check.h"
#include "ampkit/option_text.h"
#include "kernel_module.h"

namespace ampkit {

namespace {

struct Verdicts {
  std::mutex mutex;
  std::map<std::string, std::string> refusals;  // device -> "" or why not
  bool fault_set = false;
  KernelFault fault = KernelFault::none;
  KernelCheckCost cost;
};

Verdicts& verdicts() {
  static Verdicts v;
  return v;
}

KernelFault planted_fault(const Verdicts& v) {
  if (v.fault_set) return v.fault;
  const char* env = std::getenv("AMPKIT_TEST_KERNEL_FAULT");
  const std::string name = env != nullptr ? env : "";
  if (name.empty()) return KernelFault::none;
  if (name == "load") return KernelFault::load;
  if (name == "stats") return KernelFault::stats;
  if (name == "rules") return KernelFault::rules;
  // A misspelt fault would let a test pass without the failure it means to plant.
  throw Error(ErrorCategory::usage,
              "AMPKIT_TEST_KERNEL_FAULT must be load, stats or rules, not '" + name + "'");
}

bool self_check_on() {
  const char* env = std::getenv("AMPKIT_GPU_SELF_CHECK");
  if (env == nullptr || *env == '\0') return true;
  const std::optional<bool> on = parse_bool_text(env);
  if (!on)
    throw Error(
        ErrorCategory::usage,
        std::string("AMPKIT_GPU_SELF_CHECK must be true or false (1/0, yes/no, on/off), not '") + env + "'");
  return *on;
}

// Why the kernels may not run on `device`: they do not load, or they disagree with the host forms.
std::string check_device(const at::Device& device, KernelFault fault) {
  const std::string where = device.is_cuda() ? "ampkit's kernels on " + device.str() + ": "
                                             : "the CPU stand-ins of ampkit's kernels: ";
  if (fault == KernelFault::load) return where + "their module did not load (a planted failure)";
  if (device.is_cuda()) {
    const std::string failure = kernel_module_failure(device.index());
    if (!failure.empty()) return where + failure;
  }
  if (!self_check_on()) return "";
  std::string why;
  const SyncDebugModeSuspended own_syncs;  // the check's copies and reads, not the user's step
  try {
    why = check_stats_kernel(device, fault == KernelFault::stats);
    if (why.empty()) why = check_rules_kernel(device, fault == KernelFault::rules);
  } catch (const std::exception& e) {  // a launch the driver refused is a reason too
    why = std::string("their first-use self-check failed: ") + e.what();
  }
  return why.empty() ? "" : where + why;
}

}  // namespace

void set_kernel_fault(KernelFault fault) {
  Verdicts& v = verdicts();
  std::lock_guard<std::mutex> lock(v.mutex);
  v.fault_set = true;
  v.fault = fault;
  v.refusals.clear();
}

std::string kernel_refusal(const at::Device& device) {
  if (device.is_cuda() && !chunk_kernel_built()) return "";  // nothing of ours runs there
  Verdicts& v = verdicts();
  std::lock_guard<std::mutex> lock(v.mutex);
  const auto found = v.refusals.find(device.str());
  if (found != v.refusals.end()) return found->second;
  // Not decided, and not kept: a step captured before any uncaptured one is the caller's mistake.
  if (device.is_cuda() && current_stream_capturing(device.index()))
    throw Error(ErrorCategory::usage, "ampkit's kernels on " + device.str() +
                                          " are checked on their first use, which cannot run inside a CUDA "
                                          "graph capture: run one step on this device before capturing");
  const auto start = std::chrono::steady_clock::now();
  const std::string why = check_device(device, planted_fault(v));
  v.cost.checks += 1;
  v.cost.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v.refusals.emplace(device.str(), why).first->second;
}

std::string agree_kernel_refusal(const at::Device& device, const std::vector<std::string>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].empty()) continue;
    const std::string why = "rank " + std::to_string(r) + ": " + ranks[r];
    Verdicts& v = verdicts();
    std::lock_guard<std::mutex> lock(v.mutex);
    v.refusals[device.str()] = why;
    return why;
  }
  return "";
}

KernelCheckCost kernel_check_cost() {
  Verdicts& v = verdicts();
  std::lock_guard<std::mutex> lock(v.mutex);
  return v.cost;
}

void fall_back_where_kernel_refused(DeviceStatsRecipe requested, const at::Device& device,
                                    ResolvedStatsRecipe& resolved) {
  if (resolved.recipe != DeviceStatsRecipe::chunk_kernel || !device.is_cuda()) return;
  const std::string why = kernel_refusal(device);
  if (why.empty()) return;
  if (requested == DeviceStatsRecipe::chunk_kernel)
    throw Error(ErrorCategory::usage, "the chunk_kernel statistics recipe cannot run: " + why);
  resolved = {DeviceStatsRecipe::foreach_ops,
              "gradient statistics: foreach_ops instead of chunk_kernel: " + why};
}

}  // namespace ampkit
