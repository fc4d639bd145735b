// The base every plugin object derives from: run start-up and checkpointable state.
#pragma once

#include <ampkit/state.h>
#include <ampkit/step.h>

#if defined(__GNUC__)
#define AMPKIT_INTERFACE __attribute__((visibility("default")))
#else
#define AMPKIT_INTERFACE
#endif

namespace ampkit {

class AMPKIT_INTERFACE Strategy {
 public:
  virtual ~Strategy() = default;
  // Called once before the first step, with facts the options cannot know (precision, ranks).
  virtual void start(const RunInfo& info) { (void)info; }
  // Everything needed to continue exactly where the run stopped; restored by load().
  virtual State save() const { return {}; }
  virtual void load(const State& state) { (void)state; }
};

}  // namespace ampkit
