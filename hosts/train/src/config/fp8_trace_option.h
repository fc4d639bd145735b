// --fp8-trace's value. Only the session's fp8 setup reads it, so it is held in
// TrainConfig::workload_values by its type (config/option_builders.h), as a workload's options are.
#pragma once

#include <string>

namespace ampkit {

struct Fp8TraceOption {
  std::string file;  // the JSON-lines trace of every fp8 cast's magnitudes; empty: none
};

}  // namespace ampkit
