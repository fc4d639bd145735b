// ampkit-train's --inject grammar, KIND@step=N[,layer=NAME][,rank=R][,target=output|grad]
// [,factor=X]: the engine plants faults (ampkit/fault_injection.h); the host owns their spelling.
#pragma once

#include <ampkit/fault_injection.h>

#include <string>
#include <vector>

namespace ampkit::train {

// The grammar, for help texts and error messages.
constexpr const char* kFaultSpecGrammar =
    "KIND@step=N[,layer=NAME][,rank=R][,target=output|grad][,factor=X] with KIND nan, inf or spike";

// Parses one --inject value; throws Error(usage) naming what is wrong.
Fault parse_fault(const std::string& spec);

// Checks faults against the model: `layer` must be one of `hook_points` (the model's leaf
// modules), `rank` below `world_size`. Throws Error(usage) with a "did you mean".
void validate_faults(const std::vector<Fault>& faults, const std::vector<std::string>& hook_points,
                     int world_size);

}  // namespace ampkit::train
