// vmmipc's dlsym and dlvsym. Programs that find driver functions with
// dlsym(dlopen("libcuda.so.1"), "cu...") (libcudart, cuda-python) get the hook
// for hooked names. Everything else must behave exactly like libc's dlsym.
//
// RTLD_NEXT resolves relative to the *caller*, which libc finds from its
// return address. So the fall-through path is a tail call (compiled as a jump:
// see the optimize attribute) and the caller's return address reaches libc
// unchanged; tests/e2e checks dlsym(RTLD_NEXT, ...) from a preloaded program.
#include <dlfcn.h>

#include "entry/hook_table.h"

namespace {

inline void* Intercept(void* handle, const char* name) {
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT || name == nullptr) return nullptr;
  void* hook = vmmipc::entry::HookByName(name);
  if (hook == nullptr || !vmmipc::entry::IsDriverHandle(handle)) return nullptr;
  return hook;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void* vmmipc_dlsym(
    void* handle, const char* name) {
  if (void* hook = Intercept(handle, name)) return hook;
  return vmmipc::core::RealDlsym()(handle, name);
}

__attribute__((visibility("default"), optimize("O2", "optimize-sibling-calls"))) void*
vmmipc_dlvsym(void* handle, const char* name, const char* version) {
  if (void* hook = Intercept(handle, name)) return hook;
  return vmmipc::core::RealDlvsym()(handle, name, version);
}

// One body, two glibc versions of dlsym: programs built before glibc 2.34
// reference the base version, newer ones GLIBC_2.34.
__attribute__((visibility("default"), alias("vmmipc_dlsym"))) void* vmmipc_dlsym_base(void*,
                                                                                      const char*);
}

#if defined(__aarch64__)
__asm__(".symver vmmipc_dlsym_base, dlsym@GLIBC_2.17");
#else
__asm__(".symver vmmipc_dlsym_base, dlsym@GLIBC_2.2.5");
#endif
__asm__(".symver vmmipc_dlsym, dlsym@@GLIBC_2.34");
__asm__(".symver vmmipc_dlvsym, dlvsym@@GLIBC_2.34");
