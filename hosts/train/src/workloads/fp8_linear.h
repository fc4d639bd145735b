// The fp8 linear layers of ampkit-train's workloads: one block of scaling state for all of a
// model's layers, updated by the run's fp8 recipe once per step (docs/fp8.md, "ampkit-train").
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/comm_backend.h>
#include <ampkit/fp8_recipe.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ampkit::train {

// What ampkit.fp8.Linear computes (python/ampkit/_fp8_cast.py), for `layers` layers of one model:
// input and weight cast to the recipe's formats by their scales (clamped first: torch's casts do
// not saturate), multiplied with at::_scaled_mm by the inverse scales; the backward's two gemms
// take grad_output cast the same way. Rows 3i..3i+2 of the block are layer i's roles (Fp8Role).
class Fp8Linears {
 public:
  Fp8Linears(Fp8Recipe& recipe, std::string recipe_name, int64_t layers, const at::Device& device);

  // x @ weight^T + bias through layer `layer`'s scales; records the amaxes and saturation of a
  // pass that a backward can follow (evaluation under no_grad records nothing).
  at::Tensor linear(int64_t layer, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

  // Before a step's first forward: the update the last backward made due, for all layers in ONE
  // recipe call, after ONE collective that takes every rank's amaxes' maximum, so all ranks cast
  // with the same scales. Returns the non-finite amaxes the recipe reported (their scales stay).
  int64_t begin_step(CommBackend& comm);

  // Per role: the smallest scale this step cast with, the largest amax seen, and the fraction of
  // elements whose |x * scale| exceeded the format's maximum before the clamp (one host read).
  nlohmann::json step_metrics() const;
  // {role: value} rows for TensorBoard, from step_metrics()'s object.
  static std::vector<std::pair<std::string, double>> scalars(const nlohmann::json& metrics);

  // Scales, histories and this step's amaxes (an update still due included): a resume from them
  // continues bit for bit.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);
  const std::string& recipe_name() const { return recipe_name_; }
  bool current_scaling() const { return current_; }
  // The scales the casts use (recipes with history; under current scaling each cast's own).
  const std::vector<float>& scales() const { return scale_host_; }

  // A measurement (one host read per step): from now on each step's cast tensors are summarised
  // before the clamp, per layer and role (amax, count, 64 largest magnitudes, 1/32-binade log2
  // histogram), and write_trace() appends them to `path` as JSON lines (docs/fp8.md).
  void open_trace(const std::string& path);
  void write_trace(int64_t step);

  // Called by the autograd function (fp8_linear.cpp); not for workloads.
  struct Cast;
  Cast cast_for(int64_t layer, int64_t role, const at::Tensor& t, bool record);
  void make_due() { due_ = true; }

 private:
  at::Tensor scale_of(int64_t layer, int64_t role, const at::Tensor& amax) const;
  void note_trace(int64_t slot, const at::Tensor& t);

  Fp8Recipe& recipe_;
  std::string recipe_name_;
  int64_t layers_, window_;
  bool current_;
  double eps_;
  std::array<at::ScalarType, 3> dtypes_{};
  std::array<double, 3> max_{};
  std::vector<int64_t> roles_;
  at::Tensor scale_;      // [3L] float32 on the model's device: the scales the casts use
  at::Tensor amax_;       // [3L] float32: this step's amaxes, the maximum over a layer's calls
  at::Tensor saturated_;  // [3] float64: elements past the format's maximum, per role
  std::array<double, 3> counted_{};
  std::vector<float> scale_host_, history_;  // the recipe's host arrays
  bool due_ = false;
  std::ofstream trace_;  // open_trace(): per slot the histogram [3L, bins], top [3L, 64], counts
  std::string trace_path_;
  at::Tensor trace_hist_, trace_top_;
  std::vector<int64_t> trace_count_;
};

struct Fp8Linears::Cast {
  at::Tensor fp8;    // the cast tensor
  at::Tensor scale;  // its quantisation scale (0-dim float32)
  at::Tensor amax;   // the largest magnitude of the tensor before the cast (0-dim)
};

}  // namespace ampkit::train
