// Loading of the real driver table: dlopen once, resolve every entry point of
// entry_points.h with libc's dlsym (not vmmipc's hook), refuse a "driver"
// that is vmmipc itself, keep the handle for the process life.
#include "driver/real_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

#include "common/log.h"
#include "driver/real_symbols.h"

namespace vmmipc::driver {
namespace {

// Where cuda.h declares a symbol under its own name, the table's signature
// must be cuda.h's (the v1 ABIs that cuda.h renames to _v2 are hooks, and
// entry/exports.cc defines them with the same signature as the table).
#define VMMIPC_DRIVER_CHECK(symbol, member, parameters)                      \
  static_assert(std::is_same_v<decltype(&::symbol), CUresult(*) parameters>, \
                #symbol ": signature differs from cuda.h");
#define VMMIPC_DRIVER_SKIP(...)
VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_DRIVER_CHECK, VMMIPC_DRIVER_SKIP)
#undef VMMIPC_DRIVER_SKIP
#undef VMMIPC_DRIVER_CHECK

RealDriver g_loaded;
std::once_flag g_once;
std::atomic<bool> g_ok{false};  // read without the once flag

// The file vmmipc's own code lives in (libvmmipc.so; a test binary when the
// layers are linked statically), or "" when dladdr cannot tell.
std::string OwnModule(const void** base) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&OwnModule), &info) == 0) return "";
  *base = info.dli_fbase;
  return info.dli_fname != nullptr ? info.dli_fname : "";
}

// The first entry point of `table` that lies in vmmipc's own module, or
// nullptr. Such a "driver" (VMMIPC_CUDA_LIBRARY naming libvmmipc.so, or a
// library that forwards to it) hands vmmipc its own hooks back: every hook
// would call itself until the stack overflows.
const char* EntryPointInsideVmmipc(const RealDriver& table, const void* own_base) {
  if (own_base == nullptr) return nullptr;
  auto inside = [own_base](const void* fn) {
    Dl_info info{};
    return fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fbase == own_base;
  };
#define VMMIPC_DRIVER_INSIDE(symbol, member, ...) \
  if (inside(reinterpret_cast<const void*>(table.member))) return #symbol;
  VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_DRIVER_INSIDE, VMMIPC_DRIVER_INSIDE)
#undef VMMIPC_DRIVER_INSIDE
  return nullptr;
}

void LoadOnce(const std::string& path) {
  // RTLD_NOLOAD first: normally the program already loaded libcuda, and we
  // want exactly that copy.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    VMMIPC_LOG_ERROR(
        "cannot load the CUDA driver '{}': {}; every hook that "
        "needs it fails with CUDA_ERROR_NOT_SUPPORTED (set VMMIPC_CUDA_LIBRARY?)",
        path, why ? why : "unknown");
    return;
  }
  DlsymFn real_dlsym = RealDlsym();
  RealDriver table;
  table.library = library;
#define VMMIPC_DRIVER_RESOLVE(symbol, member, ...) \
  table.member = reinterpret_cast<decltype(table.member)>(real_dlsym(library, #symbol));
  VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_DRIVER_RESOLVE, VMMIPC_DRIVER_RESOLVE)
#undef VMMIPC_DRIVER_RESOLVE
  const void* own_base = nullptr;
  const std::string own_path = OwnModule(&own_base);
  if (const char* symbol = EntryPointInsideVmmipc(table, own_base)) {
    // Treated like a driver that cannot be loaded: the table stays empty.
    VMMIPC_LOG_ERROR(
        "refusing the CUDA driver '{}': its {} is vmmipc's own ({}), so every call "
        "would come back to vmmipc; every hook that needs the driver fails with "
        "CUDA_ERROR_NOT_SUPPORTED (set VMMIPC_CUDA_LIBRARY to the real libcuda.so.1)",
        path, symbol, own_path);
    dlclose(library);
    return;
  }
  g_loaded = table;
  g_ok.store(true, std::memory_order_release);
}

}  // namespace

const RealDriver& Load(const std::string& library) {
  std::call_once(g_once, [&] { LoadOnce(library); });
  return g_loaded;
}

bool Loaded() { return g_ok.load(std::memory_order_acquire); }

CUresult MissingEntryPoint(const char* member) {
  // Without any driver the load already said, once, that every hook fails.
  if (Loaded()) VMMIPC_LOG_ERROR("the real driver has no {}", member);
  return CUDA_ERROR_NOT_SUPPORTED;
}

const char* ErrorName(CUresult result) {
  const char* name = nullptr;
  const RealDriver& real = g_loaded;
  if (Loaded() && real.GetErrorName != nullptr &&
      real.GetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr)
    return name;
  return "CUDA_ERROR_UNKNOWN_CODE";
}

}  // namespace vmmipc::driver
