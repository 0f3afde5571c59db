// The table built from hooked_symbols.def: name -> vmmipc's hook, and the
// real driver's pointer for each, so that pointers handed out by the driver's
// cuGetProcAddress can be swapped for hooks.
#pragma once

#include <cstddef>

namespace vmmipc::entry {

// vmmipc's hook for a hooked name, or nullptr.
void* HookByName(const char* name);
// vmmipc's hook standing in for a real driver pointer `real` that was
// returned for `symbol` at `version`; `real` itself when it is not hooked.
void* SubstituteHook(const char* symbol, int version, void* real);
// True if `handle` is the dlopen handle of the loaded real driver.
bool IsDriverHandle(void* handle);

}  // namespace vmmipc::entry
