// What the Python layer reads from C++ instead of spelling it again: the kinds a GradScaler
// selects, the precisions, the error categories and the dtypes autocast runs them in.
#pragma once

#include <ampkit/step.h>

#include <string>

namespace ampkit::python {

// The kinds a GradScaler uses, in sdk/include/ampkit/kinds.h's order: data-parallel averaging is
// torch DDP's in a Python loop, so `comm` is not one of them.
inline constexpr const char* kStepKinds[] = {"scaler", "clipper", "nan_policy"};

// Throws Error(usage) unless `kind` is one of kStepKinds (naming `comm`'s reason, or the closest).
void check_step_kind(const std::string& kind);
// The precision spelled `text`, or Error(usage) listing the precisions.
Precision precision_from(const std::string& text);

}  // namespace ampkit::python
