// Built twice into two folders: the same scaler 'duplicate' offered by two files.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, duplicate, broken::ConstantScaler, "Test plugin present in two folders")
