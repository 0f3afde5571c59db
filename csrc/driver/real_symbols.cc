// libc's dlsym/dlvsym, reached without going through vmmipc's exported hooks.
//
// Why this works: the hooks export dlsym at versions GLIBC_2.2.5 and
// GLIBC_2.34 (so that programs built against any glibc bind to them) but
// dlvsym only at GLIBC_2.34. The reference below is bound at link time to the
// older dlvsym@GLIBC_2.2.5, which only libc defines, so the dynamic linker
// skips vmmipc and finds libc's. With the real dlvsym, RTLD_NEXT from this
// library then yields libc's dlsym.
#include "driver/real_symbols.h"

#include <dlfcn.h>

#include <atomic>
#include <initializer_list>

#if defined(__x86_64__)
#define VMMIPC_GLIBC_BASE_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define VMMIPC_GLIBC_BASE_VERSION "GLIBC_2.17"
#else
#error "vmmipc supports x86-64 and aarch64 Linux"
#endif

extern "C" void* vmmipc_libc_dlvsym(void* handle, const char* name, const char* version);
__asm__(".symver vmmipc_libc_dlvsym, dlvsym@" VMMIPC_GLIBC_BASE_VERSION);

namespace vmmipc::driver {
namespace {
std::atomic<DlsymFn> g_dlsym{nullptr};
}  // namespace

DlvsymFn RealDlvsym() { return &vmmipc_libc_dlvsym; }

DlsymFn RealDlsym() {
  DlsymFn fn = g_dlsym.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  // Newest first: GLIBC_2.34 moved dlsym into libc proper.
  for (const char* version : {"GLIBC_2.34", VMMIPC_GLIBC_BASE_VERSION}) {
    fn = reinterpret_cast<DlsymFn>(vmmipc_libc_dlvsym(RTLD_NEXT, "dlsym", version));
    if (fn != nullptr) break;
  }
  g_dlsym.store(fn, std::memory_order_release);
  return fn;
}

}  // namespace vmmipc::driver
