// The exported C entry points: a thin noexcept boundary. Each turns its call
// into core's, catches everything (nothing may unwind into a C caller), and
// returns a CUresult. Definitions follow hooked_symbols.def, one each.
#include <cuda.h>

#include "common/log.h"
#include "core/export_arena.h"
#include "core/ipc.h"
#include "driver/real_driver.h"
#include "entry/hook_table.h"

// cuda.h maps these names to their _v2 ABIs; vmmipc exports both spellings.
#undef cuIpcOpenMemHandle
#undef cuMemGetAddressRange
#undef cuGetProcAddress

#define VMMIPC_EXPORT extern "C" __attribute__((visibility("default")))

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

CUresult ProcAddressResult(const char* symbol, void** pfn, int version, CUresult result) {
  if (result == CUDA_SUCCESS && symbol != nullptr && pfn != nullptr && *pfn != nullptr)
    *pfn = vmmipc::entry::SubstituteHook(symbol, version, *pfn);
  return result;
}

}  // namespace

namespace core = vmmipc::core;

VMMIPC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  return Guard(__func__, [&] { return core::IpcGetMemHandle(handle, dptr); });
}

VMMIPC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                          unsigned int flags) {
  return Guard(__func__, [&] { return core::IpcOpenMemHandle(pdptr, handle, flags, false); });
}

VMMIPC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                             unsigned int flags) {
  return Guard(__func__, [&] { return core::IpcOpenMemHandle(pdptr, handle, flags, true); });
}

VMMIPC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return Guard(__func__, [&] { return core::IpcCloseMemHandle(dptr); });
}

VMMIPC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                   const CUmemAllocationProp* prop, unsigned long long flags) {
  return Guard(__func__, [&] { return core::MemCreate(handle, size, prop, flags); });
}

VMMIPC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return Guard(__func__, [&] { return core::MemRelease(handle); });
}

VMMIPC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                           CUdeviceptr addr, unsigned long long flags) {
  return Guard(__func__, [&] { return core::MemAddressReserve(ptr, size, alignment, addr, flags); });
}

VMMIPC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return Guard(__func__, [&] { return core::MemAddressFree(ptr, size); });
}

VMMIPC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return Guard(__func__, [&] { return core::MemMap(ptr, size, offset, handle, flags); });
}

VMMIPC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return Guard(__func__, [&] { return core::MemUnmap(ptr, size); });
}

VMMIPC_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                             CUdeviceptr ptr) {
  return Guard(__func__, [&] { return core::PointerGetAttribute(data, attribute, ptr); });
}

VMMIPC_EXPORT CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes,
                                              void** data, CUdeviceptr ptr) {
  return Guard(__func__,
               [&] { return core::PointerGetAttributes(count, attributes, data, ptr); });
}

// The 32-bit v1 ABI cannot address VMM memory: straight to the driver.
VMMIPC_EXPORT CUresult cuMemGetAddressRange(unsigned int* pbase, unsigned int* psize,
                                            unsigned int dptr) {
  return Guard(__func__, [&] { return VMMIPC_REAL(MemGetAddressRangeV1, pbase, psize, dptr); });
}

VMMIPC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                               CUdeviceptr dptr) {
  return Guard(__func__, [&] { return core::MemGetAddressRange(pbase, psize, dptr); });
}

VMMIPC_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version,
                                        cuuint64_t flags) {
  return Guard(__func__, [&] {
    return ProcAddressResult(symbol, pfn, version,
                             VMMIPC_REAL(GetProcAddressV1, symbol, pfn, version, flags));
  });
}

VMMIPC_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                           cuuint64_t flags,
                                           CUdriverProcAddressQueryResult* status) {
  return Guard(__func__, [&] {
    return ProcAddressResult(symbol, pfn, version,
                             VMMIPC_REAL(GetProcAddress, symbol, pfn, version, flags, status));
  });
}

// The table of hooked_symbols.def, for hook_table.cc.
namespace vmmipc::entry {
struct HookEntry {
  const char* name;
  void* hook;
};
extern const HookEntry kHooks[];
extern const size_t kHookCount;
const HookEntry kHooks[] = {
#define VMMIPC_HOOK(name) {#name, reinterpret_cast<void*>(&::name)},
#include "entry/hooked_symbols.def"
#undef VMMIPC_HOOK
};
const size_t kHookCount = sizeof(kHooks) / sizeof(kHooks[0]);
}  // namespace vmmipc::entry
