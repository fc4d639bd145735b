// Built with AMPKIT_ABI_VERSION_OVERRIDE set to the host's ABI + 1 (abi_newer) or - 1 (abi_older):
// a valid plugin of an ABI this host does not speak.
#include "broken_scaler.h"

// One level of indirection, so AMPKIT_TEST_PLUGIN_NAME is expanded before AMPKIT_PLUGIN quotes it.
#define BROKEN_ABI_PLUGIN(name) \
  AMPKIT_PLUGIN(scaler, name, broken::ConstantScaler, "Test plugin built for another ampkit ABI")
BROKEN_ABI_PLUGIN(AMPKIT_TEST_PLUGIN_NAME)
