// guarded() (python/src/errors.h), which every binding of `import ampkit` runs its C++ in: a throw
// of something that is not a std::exception becomes the Python exception of its category with a
// message naming its source (ampkit.PluginError naming the plugin and the call it left, or
// ampkit.AmpkitError), never torch's "Caught an unknown exception!".
#define BOOST_TEST_MODULE python_errors
#include <ampkit/plugin_call.h>
#include <c10/util/Exception.h>

#include <boost/test/unit_test.hpp>
#include <string>

#include "errors.h"

using namespace ampkit;
using ampkit::python::guarded;
using ampkit::python::last_error;

namespace {

// What guarded() threw for `body` (torch turns c10::Error into RuntimeError): its message.
template <class F>
std::string thrown_by_guarded(F&& body) {
  try {
    guarded(body);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(nothing thrown)";
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_int_thrown_in_a_plugin_call_is_a_plugin_error_naming_the_plugin_and_the_call) {
  const std::string what = thrown_by_guarded([] {
    PluginCall call(plugin_id("scaler 'thrower' 0.1.0 (/x/libampkit-scaler-thrower.so)"), "update()");
    throw 42;
  });
  const std::string expected =
      "scaler 'thrower' 0.1.0 (/x/libampkit-scaler-thrower.so) threw something that is not a std::exception "
      "in update()";
  BOOST_TEST(last_error().kind == static_cast<int64_t>(ErrorCategory::plugin));  // -> ampkit.PluginError
  BOOST_TEST(last_error().message == expected);
  BOOST_TEST(what == expected);
}

BOOST_AUTO_TEST_CASE(an_int_thrown_outside_plugin_calls_is_an_internal_error_saying_so) {
  // A plugin call that returned normally, and one an exception left in an earlier guarded call:
  // neither is this throw's source.
  (void)thrown_by_guarded([] {
    PluginCall call(plugin_id("scaler 'thrower' 0.1.0 (/x/libampkit-scaler-thrower.so)"), "update()");
    throw 1;
  });
  const std::string what = thrown_by_guarded([] {
    { PluginCall call(plugin_id("scaler 'thrower' 0.1.0 (/x/libampkit-scaler-thrower.so)"), "scale()"); }
    throw 42;
  });
  const std::string expected =
      "ampkit threw something that is not a std::exception, outside any plugin call (a bug in ampkit: "
      "please report it)";
  BOOST_TEST(last_error().kind == static_cast<int64_t>(ErrorCategory::internal));  // -> ampkit.AmpkitError
  BOOST_TEST(last_error().message == expected);
  BOOST_TEST(what == expected);
}
