// A valid scaler plugin; the tests select it where a clipper is expected.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, wrong_kind, broken::ConstantScaler, "Test scaler selected as a clipper")
