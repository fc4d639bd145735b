// Built with AMPKIT_ABI_VERSION_OVERRIDE=2: a valid plugin of an ABI this host does not speak.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, abi_mismatch, broken::ConstantScaler, "Test plugin built for another ampkit ABI")
