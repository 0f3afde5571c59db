// The exported C entry points: a thin noexcept boundary, generated from
// driver/entry_points.h (through core/real.h). Each hook decides once whether
// vmmipc is active (inactive: straight to the real driver), turns its call
// into core's function of the same member name (or entry's own, below),
// catches everything (nothing may unwind into a C caller), and returns a
// CUresult.
#include <cuda.h>

#include <new>
#include <string_view>

#include "common/log.h"
#include "core/hooks.h"
#include "core/real.h"
#include "entry/hook_table.h"

// cuda.h maps these names to their _v2 ABIs; vmmipc exports both spellings.
#undef cuIpcOpenMemHandle
#undef cuMemGetAddressRange
#undef cuGetProcAddress

namespace vmmipc::entry {
namespace {

template <typename Body>
CUresult Guard(const char* name, Body body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    VMMIPC_LOG_ERROR("{}: out of host memory", name);
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    VMMIPC_LOG_ERROR("{}: internal error: {}", name, e.what());
    return CUDA_ERROR_UNKNOWN;
  } catch (...) {
    VMMIPC_LOG_ERROR("{}: internal error", name);
    return CUDA_ERROR_UNKNOWN;
  }
}

// What a hook does when vmmipc is not active (VMMIPC_ENABLE=0, or no
// driver): core's hooks are IPC semantics and are decided here, once per
// call, so core's functions run only when active and the call otherwise goes
// straight to the real driver. entry's own hooks (cuGetProcAddress) swap a
// pointer for a hook's, which forwards when inactive: they stay on, as the
// dlsym hook does.
constexpr std::string_view kEntryOwnHooks[] = {"GetProcAddressV1", "GetProcAddress"};
constexpr bool IsCoreHook(std::string_view member) {
  for (std::string_view own : kEntryOwnHooks)
    if (member == own) return false;
  return true;
}

// A renamed own hook would otherwise be gated as core's without a word.
#define VMMIPC_NO_MEMBER(...)
#define VMMIPC_MEMBER(symbol, member, ...) std::string_view(#member),
constexpr std::string_view kHookMembers[] = {
    VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_NO_MEMBER, VMMIPC_MEMBER)};
#undef VMMIPC_MEMBER
#undef VMMIPC_NO_MEMBER
constexpr bool OwnHooksAreListed() {
  for (std::string_view own : kEntryOwnHooks) {
    bool listed = false;
    for (std::string_view member : kHookMembers) listed = listed || member == own;
    if (!listed) return false;
  }
  return true;
}
static_assert(OwnHooksAreListed(), "kEntryOwnHooks names a member that is not a HOOK of the list");

CUresult ProcAddressResult(const char* symbol, void** pfn, int version, CUresult result) {
  if (result == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr)
    *pfn = SubstituteHook(symbol, version, *pfn);
  return result;
}

}  // namespace

// What each hook calls: core's function named like its table member, unless
// entry declares its own here. Only cuGetProcAddress has one: its answer is a
// pointer that entry swaps for a hook (qualified lookup finds these before the
// names the using-directive brings in).
namespace hooks {
using namespace ::vmmipc::core;

CUresult GetProcAddressV1(const char* symbol, void** function, int version, cuuint64_t flags) {
  return ProcAddressResult(symbol, function, version,
                           VMMIPC_REAL(GetProcAddressV1, symbol, function, version, flags));
}

CUresult GetProcAddress(const char* symbol, void** function, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult* status) {
  return ProcAddressResult(symbol, function, version,
                           VMMIPC_REAL(GetProcAddress, symbol, function, version, flags, status));
}

}  // namespace hooks
}  // namespace vmmipc::entry

#define VMMIPC_NOT_HOOKED(...)
#define VMMIPC_UNPAREN(...) __VA_ARGS__
#define VMMIPC_EXPORT_HOOK(symbol, member, proc, since, until, parameters, arguments)        \
  extern "C" __attribute__((visibility("default"))) CUresult symbol parameters {             \
    return ::vmmipc::entry::Guard(#symbol, [&] {                                             \
      if constexpr (::vmmipc::entry::IsCoreHook(#member)) {                                  \
        if (!::vmmipc::core::Active()) return VMMIPC_REAL(member, VMMIPC_UNPAREN arguments); \
      }                                                                                      \
      return ::vmmipc::entry::hooks::member arguments;                                       \
    });                                                                                      \
  }
VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_NOT_HOOKED, VMMIPC_EXPORT_HOOK)
#undef VMMIPC_EXPORT_HOOK
#undef VMMIPC_UNPAREN

// The hooks in the order of the list, for hook_table.cc.
namespace vmmipc::entry {
const HookEntry kHooks[kHookCount] = {
#define VMMIPC_HOOK_ENTRY(symbol, member, proc, since, until, parameters, arguments) \
  {#symbol, #proc, since, until, reinterpret_cast<void*>(&::symbol)},
    VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_NOT_HOOKED, VMMIPC_HOOK_ENTRY)
#undef VMMIPC_HOOK_ENTRY
#undef VMMIPC_NOT_HOOKED
};
}  // namespace vmmipc::entry
