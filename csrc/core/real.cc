// The real driver as core reaches it: loaded from the configured library,
// whether vmmipc is active on it (core/hooks.h Active), and the "is this
// libcuda's handle" question of the dlsym hook, which needs the same library
// name.
#include "core/real.h"

#include <dlfcn.h>

#include <atomic>

#include "config/params.h"
#include "core/hooks.h"

namespace vmmipc::core {

const driver::RealDriver& Real() {
  // One guard check per call, as before the table needed a library name.
  static const driver::RealDriver& table = driver::Load(config::Get().cuda_library);
  return table;
}

bool DriverLoaded() {
  Real();
  return driver::Loaded();
}

// Decided once: neither the variable nor the driver's loading changes later.
bool Active() {
  static const bool enabled = config::Get().enable;
  return enabled && DriverLoaded();
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

}  // namespace vmmipc::core
