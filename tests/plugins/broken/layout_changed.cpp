// Built against a copy of the SDK headers in which StepStats gained a field at the front, under
// the same AMPKIT_ABI_VERSION (tests/plugins/broken/CMakeLists.txt makes the copy): a plugin
// that would read every StepStats field at the wrong offset. The host refuses it from its
// layout record, naming StepStats, before any of its code runs.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, layout_changed, broken::ConstantScaler, "Test plugin built against an edited StepStats")
