// Built with AMPKIT_TORCH_VERSION_OVERRIDE="2.10.0": a valid plugin for another LibTorch.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, torch_mismatch, broken::ConstantScaler, "Test plugin built for another torch")
