// torch.classes.ampkit.Fp8Recipe: an fp8_recipe plugin loaded by name for the Python fp8 layers.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ampkit/registry.h"
#include "ampkit/strategy_set.h"
#include "errors.h"

namespace ampkit::python {

// One fp8 recipe, loaded through the registry exactly as a GradScaler's plugins are (the same
// search path, trust check, crash probe and plugin-call guard: a recipe that crashes, throws or
// answers a scale that is not finite and > 0 is a plugin error naming it and the call). The
// history and scales stay the caller's tensors (the model's buffers); update() writes them in place.
class Fp8RecipeCore : public torch::CustomClassHolder {
 public:
  // `plugin`: a name or a path; `options`: option name -> value text, checked against the
  // plugin's declared types and ranges; `plugin_dirs`: searched first, then AMPKIT_PLUGIN_PATH and
  // the built-in plugins' folder; `plugin_timeout`: seconds per plugin call, -1 for no limit.
  Fp8RecipeCore(const std::string& plugin, const c10::Dict<std::string, std::string>& options,
                const std::vector<std::string>& plugin_dirs, bool allow_untrusted, int64_t plugin_timeout);

  int64_t history_length() const;
  bool current_scaling() const;
  double current_eps() const;
  std::string fp8_format(int64_t role) const;
  // One step's update of every tensor (Fp8Recipe::update): roles int64 [n], amax float32 [n],
  // history float32 [n, history_length()], scale float32 [n], each a contiguous CPU tensor;
  // history and scale are written in place. Returns the number of non-finite amaxes.
  int64_t update(const at::Tensor& roles, const at::Tensor& amax, const at::Tensor& history,
                 const at::Tensor& scale) const;
  // The recipe's own state as JSON (checkpoint.h's tagged form), and back.
  std::string save() const;
  void load(const std::string& json_text) const;
  // "fp8_recipe 'delayed' 0.1.0 (/path/libampkit-fp8_recipe-delayed.so)".
  std::string plugin() const;

 private:
  template <class F>
  auto locked(F&& body) const -> decltype(body()) {
    const std::lock_guard<std::mutex> hold(mutex_);
    return guarded(std::forward<F>(body));
  }
  std::unique_ptr<Registry> registry_;
  std::unique_ptr<StrategySet> set_;
  Fp8Recipe* recipe_ = nullptr;
  mutable std::mutex mutex_;
};

}  // namespace ampkit::python
