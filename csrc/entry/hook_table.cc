// Lookups over the hooks of driver/entry_points.h: by name (dlsym), and by the
// real driver's pointer (cuGetProcAddress). The real pointers are the real
// driver table's own entries (resolved once, with the table), in the same
// order as the hooks.
#include "entry/hook_table.h"

#include <array>
#include <cstring>
#include <string_view>

#include "common/log.h"

namespace vmmipc::entry {
namespace {

// The versions cuGetProcAddress gives for one name must not overlap: each
// (name, version) has one hook. Checked when the library is compiled.
struct Window {
  std::string_view proc;
  int since;
  int until;
};
#define VMMIPC_NO_WINDOW(...)
#define VMMIPC_WINDOW(symbol, member, proc, since, until, ...) Window{#proc, since, until},
constexpr Window kWindows[] = {VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_NO_WINDOW, VMMIPC_WINDOW)};
#undef VMMIPC_WINDOW
#undef VMMIPC_NO_WINDOW
static_assert(std::size(kWindows) == kHookCount);

constexpr bool WindowsAreDisjoint() {
  for (const Window& a : kWindows) {
    if (a.since >= a.until) return false;
    for (const Window& b : kWindows)
      if (&a != &b && a.proc == b.proc && a.since < b.until && b.since < a.until) return false;
  }
  return true;
}
static_assert(WindowsAreDisjoint(), "two hooks answer cuGetProcAddress for one name and version");

// The real driver's pointer of each hook, in kHooks order: the table holds them.
std::array<void*, kHookCount> RealPointers() {
  const driver::RealDriver& real = core::Real();
  return {
#define VMMIPC_NO_POINTER(...)
#define VMMIPC_POINTER(symbol, member, ...) reinterpret_cast<void*>(real.member),
      VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_NO_POINTER, VMMIPC_POINTER)
#undef VMMIPC_POINTER
#undef VMMIPC_NO_POINTER
  };
}

// When the driver's pointer matches no exported symbol (a driver that hands
// out internal entry points), pick the hook by name and ABI version.
void* HookByVersion(const char* symbol, int version) {
  for (const HookEntry& entry : kHooks)
    if (!std::strcmp(entry.proc, symbol) && entry.since <= version && version < entry.until)
      return entry.hook;
  return HookByName(symbol);
}

}  // namespace

void* HookByName(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  for (const HookEntry& entry : kHooks)
    if (!std::strcmp(entry.name, name)) return entry.hook;
  return nullptr;
}

void* SubstituteHook(const char* symbol, int version, void* real) {
  static const std::array<void*, kHookCount> real_pointers = RealPointers();
  for (size_t i = 0; i < kHookCount; ++i)
    if (real_pointers[i] == real) return kHooks[i].hook;
  if (void* hook = HookByVersion(symbol, version)) {
    VMMIPC_LOG_DEBUG("cuGetProcAddress({}, {}) returned an unexported entry point; hooked by name",
                     symbol, version);
    return hook;
  }
  return real;
}

}  // namespace vmmipc::entry
