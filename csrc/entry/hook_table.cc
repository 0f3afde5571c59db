// Lookups over the hooked_symbols.def table: by name (dlsym), and by the real
// driver's pointer (cuGetProcAddress). The real pointers are resolved once,
// through libc's dlsym on the driver's handle.
#include "entry/hook_table.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "config/params.h"
#include "driver/real_driver.h"
#include "driver/real_symbols.h"

namespace vmmipc::entry {

struct HookEntry {
  const char* name;
  void* hook;
};
extern const HookEntry kHooks[];
extern const size_t kHookCount;

namespace {

// The real driver pointer of kHooks[i], one per hook whatever their number
// (constant-initialized: nothing runs at load time).
std::vector<void*> g_real;
std::once_flag g_real_once;

void ResolveReal() {
  g_real.assign(kHookCount, nullptr);
  const driver::RealDriver& real = driver::Real();
  if (real.library == nullptr) return;
  driver::DlsymFn real_dlsym = driver::RealDlsym();
  for (size_t i = 0; i < kHookCount; ++i) g_real[i] = real_dlsym(real.library, kHooks[i].name);
}

// When the driver's pointer matches no exported symbol (a driver that hands
// out internal entry points), pick the hook by base name and ABI version.
void* HookByVersion(const char* symbol, int version) {
  if (!std::strcmp(symbol, "cuIpcOpenMemHandle"))
    return HookByName(version >= 11000 ? "cuIpcOpenMemHandle_v2" : "cuIpcOpenMemHandle");
  if (!std::strcmp(symbol, "cuGetProcAddress"))
    return HookByName(version >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress");
  if (!std::strcmp(symbol, "cuMemGetAddressRange"))
    return HookByName(version >= 3020 ? "cuMemGetAddressRange_v2" : "cuMemGetAddressRange");
  return HookByName(symbol);
}

}  // namespace

void* HookByName(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  for (size_t i = 0; i < kHookCount; ++i)
    if (!std::strcmp(kHooks[i].name, name)) return kHooks[i].hook;
  return nullptr;
}

void* SubstituteHook(const char* symbol, int version, void* real) {
  std::call_once(g_real_once, ResolveReal);
  for (size_t i = 0; i < g_real.size(); ++i)
    if (g_real[i] == real) return kHooks[i].hook;
  if (void* hook = HookByVersion(symbol, version)) {
    VMMIPC_LOG_DEBUG("cuGetProcAddress({}, {}) returned an unexported entry point; hooked by name",
                     symbol, version);
    return hook;
  }
  return real;
}

bool IsDriverHandle(void* handle) {
  static std::atomic<void*> known{nullptr};
  void* cached = known.load(std::memory_order_acquire);
  if (cached != nullptr) return handle == cached;
  // Without loading anything: if the driver is not loaded yet, no handle can be its.
  void* loaded = dlopen(config::Get().cuda_library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (loaded == nullptr) return false;
  dlclose(loaded);  // drop the reference RTLD_NOLOAD took; the library stays loaded
  known.store(loaded, std::memory_order_release);
  return handle == loaded;
}

}  // namespace vmmipc::entry
