// CUDA's rounding of a division by a plain number, reproduced on CPU tensors for tests. ATen's CUDA
// true-division kernel takes a CPU scalar divisor (at::div(t, 3), t / 3, t.div_(3)) as a * (1 / b),
// computed in the operands' opmath type, where the CPU kernel divides: x * (1/3) and x / 3 differ
// in float64 for about a third of all x. With CudaDivision alive, div.Scalar and div_.Scalar on
// CPU float and double tensors round as CUDA's kernel does, so a test on the CPU catches a device
// value that a plain-number division made and the host recomputes with a true division. Include it
// in one file of a test program only (it registers kernels with the dispatcher).
#pragma once

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include <atomic>

namespace ampkit::test {

inline std::atomic<bool> g_cuda_division{false};

// While alive (or from a forked rank's start to its exit), plain-number divisions round as on CUDA.
class CudaDivision {
 public:
  CudaDivision() { g_cuda_division = true; }
  ~CudaDivision() { g_cuda_division = false; }
  CudaDivision(const CudaDivision&) = delete;
  CudaDivision& operator=(const CudaDivision&) = delete;
};

namespace cuda_division {

// 1 / b in the opmath type of `self` (float for float, double for double), as a double.
inline double reciprocal(const at::Tensor& self, const c10::Scalar& b) {
  if (self.scalar_type() == at::kDouble) return 1.0 / b.toDouble();
  return static_cast<double>(1.0f / b.toFloat());
}

inline bool emulated(const at::Tensor& self) {
  return g_cuda_division && (self.scalar_type() == at::kDouble || self.scalar_type() == at::kFloat);
}

inline at::Tensor div_scalar(const at::Tensor& self, const c10::Scalar& other) {
  if (emulated(self)) return at::mul(self, reciprocal(self, other));
  return at::div(self, at::native::wrapped_scalar_tensor(other));  // the CPU kernel, as without this file
}

inline at::Tensor& div_scalar_(at::Tensor& self, const c10::Scalar& other) {
  if (emulated(self)) return self.mul_(reciprocal(self, other));
  return self.div_(at::native::wrapped_scalar_tensor(other));
}

}  // namespace cuda_division

}  // namespace ampkit::test

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("div.Scalar", TORCH_FN(ampkit::test::cuda_division::div_scalar));
  m.impl("div_.Scalar", TORCH_FN(ampkit::test::cuda_division::div_scalar_));
}
