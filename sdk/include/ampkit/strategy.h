// The base every plugin object derives from: run start-up and checkpointable state.
#pragma once

#include <ampkit/state.h>
#include <ampkit/step.h>

#include <stdexcept>

#if defined(__GNUC__)
#define AMPKIT_INTERFACE __attribute__((visibility("default")))
#else
#define AMPKIT_INTERFACE
#endif

namespace ampkit {

// Thrown by a strategy to stop training on purpose: the run ends as aborted (ampkit-train exit 5,
// "training aborted by <kind> '<name>'", the last good parameters checkpointed), as the dynamic
// scaler does when gradients overflow at its minimum scale. Any other exception that leaves a
// strategy call is a plugin error (exit 3) naming the plugin and the call.
class AMPKIT_INTERFACE TrainingAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class AMPKIT_INTERFACE Strategy {
 public:
  virtual ~Strategy() = default;
  // Called once before the first step, with facts the options cannot know (precision, ranks).
  virtual void start(const RunInfo& info) { (void)info; }
  // Everything needed to continue exactly where the run stopped; restored by load().
  virtual State save() const { return {}; }
  virtual void load(const State& state) { (void)state; }
  // Optional functions, found by name (ggml's get_proc_address): from ABI 5 a capability added to
  // a kind is a named C function a plugin may offer, with the signature its kind's header
  // documents, not a new virtual method, so it costs no ABI bump. nullptr: not offered. The
  // host calls what it finds outside the plugin-call guard: offer only functions that cannot fail.
  virtual void* find_function(const char* name) {
    (void)name;
    return nullptr;
  }
};

}  // namespace ampkit
