// A loaded plugin's image in this process, read from the dynamic linker's own records: where its
// code lies, and its references to functions, which the fault reporter rebinds (plugin_call.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ampkit::detail {

// A function the loaded object refers to by `name`, and what its references should reach instead.
struct Rebinding {
  const char* name;
  void* target;
};

// Rewrites the slots (GOT and PLT entries: JUMP_SLOT, GLOB_DAT, absolute 64-bit) through which the
// object `handle` (from dlopen) reaches each undefined symbol named in `rebindings`, so that its
// own code calls the target; the object's dependencies keep theirs. Returns the number of slots
// rewritten: 0 where the object refers to none of them, and on machines other than x86_64 and
// aarch64, whose relocation types this does not know.
size_t rebind_references(void* handle, const Rebinding* rebindings, size_t count);

// Remembers where the object `handle` has its executable segments, for is_plugin_code. A fixed
// table (64 segments, a plugin has one): segments beyond it are not remembered.
void record_plugin_code(void* handle);
// Whether `pc` lies in the code of an object passed to record_plugin_code. Async-signal-safe.
bool is_plugin_code(uintptr_t pc) noexcept;

}  // namespace ampkit::detail
