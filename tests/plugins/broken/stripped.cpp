// A good plugin installed stripped (strip --strip-unneeded, as packagers do): no .symtab, the
// entry is only in .dynsym. It must still be found and loaded.
#include "broken_scaler.h"

AMPKIT_PLUGIN(scaler, stripped, broken::ConstantScaler, "Test plugin whose file was stripped")
