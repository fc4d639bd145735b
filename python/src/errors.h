// How a C++ failure reaches Python: its category, kept for the Python layer, and its message.
#pragma once

#include <ampkit/strategy.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <string>

#include "ampkit/error.h"
#include "ampkit/plugin_call.h"

namespace ampkit::python {

// A NaN policy's abort decision, or a scaler that refused to go on: the run must stop (the SDK's
// type, which strategies throw).
using TrainingAborted = ampkit::TrainingAborted;

// What the last failed call on this thread was; the Python layer reads it right after the
// RuntimeError/ValueError torch raised to pick its own exception class (ampkit/_errors.py).
// kind: an ErrorCategory's value, or kAborted.
constexpr int64_t kAborted = 100;
struct LastError {
  int64_t kind = -1;
  std::string message;
};
LastError& last_error();

// What a throw of something that is not a std::exception becomes: a plugin error naming the
// plugin and the call it left, or an internal error (errors.cpp).
LastError non_standard_exception();

// Runs `body`; an exception is recorded in last_error() and rethrown as torch's ValueError
// (usage errors) or c10::Error, which torch turns into Python's ValueError and RuntimeError.
template <class F>
auto guarded(F&& body) -> decltype(body()) {
  try {
    forget_unwound_plugin_call();
    return body();
  } catch (const TrainingAborted& e) {
    last_error() = {kAborted, e.what()};
  } catch (const Error& e) {
    last_error() = {static_cast<int64_t>(e.category()), e.what()};
  } catch (const std::exception& e) {
    last_error() = {static_cast<int64_t>(ErrorCategory::internal), e.what()};
  } catch (...) {  // torch would say "Caught an unknown exception!"
    last_error() = non_standard_exception();
  }
  if (last_error().kind == static_cast<int64_t>(ErrorCategory::usage))
    throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, last_error().message);
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, last_error().message);
}

}  // namespace ampkit::python
