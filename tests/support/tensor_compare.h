// Test helpers for lists of tensors: copies, and how far two lists are apart relative to the
// reference's magnitude.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace ampkit::test {

// Copies of every tensor; an undefined one (a parameter without a gradient) stays undefined.
inline std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.defined() ? t.clone() : at::Tensor());
  return out;
}

// Largest |a - b| of a tensor relative to the largest |b| of that tensor, worst over tensors.
inline double max_rel_error(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const at::Tensor da = a[i].to(at::kDouble), db = b[i].to(at::kDouble);
    const double num = (da - db).abs().max().item<double>();
    const double den = db.abs().max().item<double>();
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

}  // namespace ampkit::test
