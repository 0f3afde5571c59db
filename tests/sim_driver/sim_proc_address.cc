// Simulated CUDA driver: cuGetProcAddress (v1 and _v2), answered from one table.
//
// As measured on the real driver: the caller names the BASE symbol ("cuIpcOpenMemHandle") and a
// CUDA version; the row with the highest minimum version not above it wins (4010 -> the v1 symbol,
// 11000 -> cuIpcOpenMemHandle_v2). Suffixed names ("..._v2") are not in the table and are not
// found. Works before cuInit, like the real one (libcudart resolves cuInit through it).
#include <cstring>

#include "sim_state.h"

namespace {

struct ProcEntry {
  const char* name;  // base name, as callers ask for it
  int min_version;   // lowest cudaVersion that gets this symbol
  void* fn;
};

template <typename F>
void* Fn(F* f) {
  return reinterpret_cast<void*>(f);
}

// Function addresses are taken directly (no dlsym): with -Bsymbolic they are this library's own
// definitions even when a preloaded library exports the same names.
const ProcEntry kProcTable[] = {
    {"cuInit", 2000, Fn(&cuInit)},
    {"cuDriverGetVersion", 2020, Fn(&cuDriverGetVersion)},
    {"cuGetErrorName", 6000, Fn(&cuGetErrorName)},
    {"cuGetErrorString", 6000, Fn(&cuGetErrorString)},
    {"cuGetProcAddress", 11030, Fn(&cuGetProcAddress)},
    {"cuGetProcAddress", 12000, Fn(&cuGetProcAddress_v2)},
    {"cuDeviceGetCount", 2000, Fn(&cuDeviceGetCount)},
    {"cuDeviceGet", 2000, Fn(&cuDeviceGet)},
    {"cuDeviceGetAttribute", 2000, Fn(&cuDeviceGetAttribute)},
    {"cuDeviceGetName", 2000, Fn(&cuDeviceGetName)},
    {"cuDeviceTotalMem", 3020, Fn(&cuDeviceTotalMem_v2)},
    {"cuDeviceGetUuid", 9020, Fn(&cuDeviceGetUuid)},
    {"cuDeviceGetUuid", 11040, Fn(&cuDeviceGetUuid_v2)},
    {"cuDeviceGetPCIBusId", 4010, Fn(&cuDeviceGetPCIBusId)},
    {"cuDeviceCanAccessPeer", 4000, Fn(&cuDeviceCanAccessPeer)},
    {"cuDevicePrimaryCtxRetain", 7000, Fn(&cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", 7000, Fn(&cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxRelease", 11000, Fn(&cuDevicePrimaryCtxRelease_v2)},
    {"cuCtxSetCurrent", 4000, Fn(&cuCtxSetCurrent)},
    {"cuCtxGetCurrent", 4000, Fn(&cuCtxGetCurrent)},
    {"cuCtxPushCurrent", 4000, Fn(&cuCtxPushCurrent_v2)},
    {"cuCtxPopCurrent", 4000, Fn(&cuCtxPopCurrent_v2)},
    {"cuCtxGetDevice", 2000, Fn(&cuCtxGetDevice)},
    {"cuCtxSynchronize", 2000, Fn(&cuCtxSynchronize)},
    {"cuMemGetAllocationGranularity", 10020, Fn(&cuMemGetAllocationGranularity)},
    {"cuMemCreate", 10020, Fn(&cuMemCreate)},
    {"cuMemRelease", 10020, Fn(&cuMemRelease)},
    {"cuMemAddressReserve", 10020, Fn(&cuMemAddressReserve)},
    {"cuMemAddressFree", 10020, Fn(&cuMemAddressFree)},
    {"cuMemMap", 10020, Fn(&cuMemMap)},
    {"cuMemUnmap", 10020, Fn(&cuMemUnmap)},
    {"cuMemSetAccess", 10020, Fn(&cuMemSetAccess)},
    {"cuMemGetAccess", 10020, Fn(&cuMemGetAccess)},
    {"cuMemExportToShareableHandle", 10020, Fn(&cuMemExportToShareableHandle)},
    {"cuMemImportFromShareableHandle", 10020, Fn(&cuMemImportFromShareableHandle)},
    {"cuMemRetainAllocationHandle", 11000, Fn(&cuMemRetainAllocationHandle)},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, Fn(&cuMemGetAllocationPropertiesFromHandle)},
    {"cuMemGetAddressRange", 2000, Fn(&cuMemGetAddressRange)},
    {"cuMemGetAddressRange", 3020, Fn(&cuMemGetAddressRange_v2)},
    {"cuMemGetInfo", 3020, Fn(&cuMemGetInfo_v2)},
    {"cuPointerGetAttribute", 4000, Fn(&cuPointerGetAttribute)},
    {"cuPointerGetAttributes", 7000, Fn(&cuPointerGetAttributes)},
    {"cuMemAlloc", 3020, Fn(&cuMemAlloc_v2)},
    {"cuMemFree", 3020, Fn(&cuMemFree_v2)},
    {"cuMemcpy", 4000, Fn(&cuMemcpy)},
    {"cuMemcpyHtoD", 3020, Fn(&cuMemcpyHtoD_v2)},
    {"cuMemcpyDtoH", 3020, Fn(&cuMemcpyDtoH_v2)},
    {"cuMemcpyDtoD", 3020, Fn(&cuMemcpyDtoD_v2)},
    {"cuMemsetD8", 3020, Fn(&cuMemsetD8_v2)},
    {"cuMemsetD32", 3020, Fn(&cuMemsetD32_v2)},
    {"cuIpcGetMemHandle", 4010, Fn(&cuIpcGetMemHandle)},
    {"cuIpcOpenMemHandle", 4010, Fn(&cuIpcOpenMemHandle)},
    {"cuIpcOpenMemHandle", 11000, Fn(&cuIpcOpenMemHandle_v2)},
    {"cuIpcCloseMemHandle", 4010, Fn(&cuIpcCloseMemHandle)},
};

CUresult Lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (pfn != nullptr) *pfn = nullptr;
  if (symbol == nullptr || pfn == nullptr ||
      (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const ProcEntry* best = nullptr;
  bool name_known = false;
  for (const ProcEntry& e : kProcTable) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    name_known = true;
    if (e.min_version <= cuda_version && (best == nullptr || e.min_version > best->min_version)) {
      best = &e;
    }
  }
  if (best == nullptr) {
    if (status != nullptr) {
      *status = name_known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                           : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  return Lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return Lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
