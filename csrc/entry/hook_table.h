// The hooks of driver/entry_points.h (reached through core/real.h) as a
// table: name -> vmmipc's hook for the dlsym hook, and real driver pointer ->
// hook for cuGetProcAddress, whose answers are swapped for hooks.
#pragma once

#include <climits>
#include <cstddef>

#include "core/real.h"

namespace vmmipc::entry {

// A hook's `until` when no later ABI replaces it.
inline constexpr int kNoLimit = INT_MAX;

struct HookEntry {
  const char* name;  // the exported symbol
  const char* proc;  // the name cuGetProcAddress is asked for
  int since;         // cuGetProcAddress versions [since, until) get this hook
  int until;
  void* hook;
};

#define VMMIPC_COUNT_NONE(...)
#define VMMIPC_COUNT_ONE(...) +1
inline constexpr size_t kHookCount =
    0 VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_COUNT_NONE, VMMIPC_COUNT_ONE);
#undef VMMIPC_COUNT_ONE
#undef VMMIPC_COUNT_NONE

// Defined in exports.cc, beside the definitions it points to.
extern const HookEntry kHooks[kHookCount];

// vmmipc's hook for a hooked name, or nullptr.
void* HookByName(const char* name);
// vmmipc's hook standing in for a real driver pointer `real` that was
// returned for `symbol` at `version`; `real` itself when it is not hooked.
void* SubstituteHook(const char* symbol, int version, void* real);
// True if `handle` is the dlopen handle of the loaded real driver.
using core::IsDriverHandle;

}  // namespace vmmipc::entry
