// Loading of the real driver table: dlopen once, resolve every entry point
// with libc's dlsym (not vmmipc's hook), keep the handle for the process life.
#include "driver/real_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "common/log.h"
#include "config/params.h"
#include "driver/real_symbols.h"

namespace vmmipc::driver {
namespace {

RealDriver g_loaded;
std::atomic<const RealDriver*> g_override{nullptr};
std::once_flag g_once;
bool g_ok = false;

void Load() {
  const std::string& path = config::Get().cuda_library;
  // RTLD_NOLOAD first: normally the program already loaded libcuda, and we
  // want exactly that copy.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    VMMIPC_LOG_ERROR("cannot load the CUDA driver '{}': {}; every hook that "
                     "needs it fails with CUDA_ERROR_NOT_SUPPORTED (set VMMIPC_CUDA_LIBRARY?)",
                     path, why ? why : "unknown");
    return;
  }
  DlsymFn real_dlsym = RealDlsym();
  g_loaded.library = library;
#define VMMIPC_DRIVER_RESOLVE(member, symbol, type) \
  g_loaded.member = reinterpret_cast<type>(real_dlsym(library, symbol));
  VMMIPC_DRIVER_FUNCTIONS(VMMIPC_DRIVER_RESOLVE)
#undef VMMIPC_DRIVER_RESOLVE
  g_ok = true;
}

}  // namespace

const RealDriver& Real() {
  if (const RealDriver* table = g_override.load(std::memory_order_acquire)) return *table;
  std::call_once(g_once, Load);
  return g_loaded;
}

bool Loaded() {
  if (g_override.load(std::memory_order_acquire) != nullptr) return true;
  Real();
  return g_ok;
}

const char* ErrorName(CUresult result) {
  const char* name = nullptr;
  const RealDriver& real = Real();
  if (real.GetErrorName != nullptr && real.GetErrorName(result, &name) == CUDA_SUCCESS &&
      name != nullptr)
    return name;
  return "CUDA_ERROR_UNKNOWN_CODE";
}

void OverrideForTesting(const RealDriver* table) {
  g_override.store(table, std::memory_order_release);
}

}  // namespace vmmipc::driver
