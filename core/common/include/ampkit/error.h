// ampkit's error type: a message a user can act on plus the category of the failure.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ampkit {

// What kind of failure an Error reports. Library code says what went wrong; only the programs
// (ampkit-train, ampkit-plugins, ampkit-launch, the benchmarks) turn a category into their exit
// code, through hosts/common/include/ampkit/exit_codes.h.
enum class ErrorCategory {
  internal,     // a bug or an unexpected failure (LibTorch error, out of memory)
  usage,        // bad command line, option value, config file or environment variable
  plugin,       // plugin not found, unreadable, untrusted, incompatible, or failed to create
  data,         // dataset missing or malformed
  checkpoint,   // checkpoint unreadable, corrupt, incompatible or not writable
  distributed,  // rendezvous failed, a rank died or timed out
  output,       // a metrics, summary or report file cannot be written
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message)
      : std::runtime_error(message), category_(category) {}
  ErrorCategory category() const { return category_; }

 private:
  ErrorCategory category_;
};

// "did you mean 'x'?" for the closest candidate within a small edit distance, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace ampkit
