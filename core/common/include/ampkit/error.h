// The host's error type: a message a user can act on plus the exit code the CLI returns.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ampkit {

// Exit codes of ampkit-train and ampkit-plugins (documented in docs/configuration.md).
enum class ExitCode : int {
  ok = 0,
  internal = 1,       // a bug or an unexpected failure (LibTorch error, out of memory)
  usage = 2,          // bad command line, option value, config file or environment variable
  plugin = 3,         // plugin not found, unreadable, untrusted, incompatible, or failed to create
  data = 4,           // dataset missing or malformed
  nan_abort = 5,      // the NaN policy stopped training (report written)
  checkpoint = 6,     // checkpoint unreadable, corrupt or incompatible
  distributed = 7,    // rendezvous failed, a rank died or timed out
  check_failed = 8,   // ampkit-plugins check found broken plugins
  interrupted = 130,  // stopped by a signal
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// "did you mean 'x'?" for the closest candidate within a small edit distance, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace ampkit
