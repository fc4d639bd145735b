// Exit codes of ampkit's programs: the one list, the mapping from error categories, and the
// "Exit codes: ..." lines of their help texts (docs/configuration.md documents the same table).
// Beside the categories, so every program (the hosts, and the Python package's interpreter when a
// plugin faults) reads one table; library code itself never exits with one.
#pragma once

#include <initializer_list>
#include <string>

#include "ampkit/error.h"

namespace ampkit {

enum class ExitCode : int {
  ok = 0,
  internal = 1,       // a bug or an unexpected failure (LibTorch error, out of memory)
  usage = 2,          // bad command line, option value, config file or environment variable
  plugin = 3,         // plugin not found, unreadable, untrusted, incompatible, or failed to create
  data = 4,           // dataset missing or malformed; your own model (torchscript) failing or untrainable
  aborted = 5,        // a strategy stopped training: the NaN policy, or the loss scaler at its floor
  checkpoint = 6,     // checkpoint unreadable, corrupt, incompatible or not writable
  distributed = 7,    // rendezvous failed, a rank died or timed out
  check_failed = 8,   // ampkit-plugins check found broken plugins
  output = 9,         // a metrics, summary or report file cannot be written
  interrupted = 130,  // stopped by a signal
};

constexpr ExitCode exit_code_of(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::usage:
      return ExitCode::usage;
    case ErrorCategory::plugin:
      return ExitCode::plugin;
    case ErrorCategory::data:
      return ExitCode::data;
    case ErrorCategory::checkpoint:
      return ExitCode::checkpoint;
    case ErrorCategory::distributed:
      return ExitCode::distributed;
    case ErrorCategory::output:
      return ExitCode::output;
    case ErrorCategory::internal:
      break;
  }
  return ExitCode::internal;
}

constexpr int exit_status(ExitCode code) {
  return static_cast<int>(code);
}

// The short words of the help texts' "Exit codes:" line.
inline const char* exit_code_words(ExitCode code) {
  switch (code) {
    case ExitCode::ok:
      return "ok";
    case ExitCode::internal:
      return "internal error";
    case ExitCode::usage:
      return "usage";
    case ExitCode::plugin:
      return "plugin";
    case ExitCode::data:
      return "data";
    case ExitCode::aborted:
      return "aborted (NaN policy or loss scaler)";
    case ExitCode::checkpoint:
      return "checkpoint";
    case ExitCode::distributed:
      return "distributed (rendezvous failed, a rank was lost or timed out)";
    case ExitCode::check_failed:
      return "check found broken plugins";
    case ExitCode::output:
      return "output file not writable";
    case ExitCode::interrupted:
      return "interrupted/preempted";
  }
  return "?";
}

// "Exit codes: 0 ok, 2 usage, ... (docs/configuration.md)." for the codes a program can return.
inline std::string exit_codes_help(std::initializer_list<ExitCode> codes) {
  std::string line = "Exit codes:";
  const char* sep = " ";
  for (const ExitCode c : codes) {
    line += sep + std::to_string(exit_status(c)) + " " + exit_code_words(c);
    sep = ", ";
  }
  return line + " (docs/configuration.md).";
}

}  // namespace ampkit
