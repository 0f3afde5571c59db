// The only code that knows libcuda exists: a table of the real driver's entry
// points, loaded once on first use (never at load time) from
// VMMIPC_CUDA_LIBRARY. Everything in vmmipc calls the driver through it; a
// call by name would bind back to vmmipc's own hooks.
#pragma once

#include <cuda.h>

namespace vmmipc::driver {

// v1 ABIs that cuda.h hides behind its _v2 macros.
using IpcOpenMemHandleV1Fn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
using MemGetAddressRangeV1Fn = CUresult (*)(unsigned int*, unsigned int*, unsigned int);
using GetProcAddressV1Fn = CUresult (*)(const char*, void**, int, cuuint64_t);

// X(member, "symbol", type)
#define VMMIPC_DRIVER_FUNCTIONS(X)                                                   \
  X(GetErrorName, "cuGetErrorName", decltype(&::cuGetErrorName))                     \
  X(DriverGetVersion, "cuDriverGetVersion", decltype(&::cuDriverGetVersion))         \
  X(CtxGetCurrent, "cuCtxGetCurrent", decltype(&::cuCtxGetCurrent))                  \
  X(CtxSetCurrent, "cuCtxSetCurrent", decltype(&::cuCtxSetCurrent))                  \
  X(CtxGetDevice, "cuCtxGetDevice", decltype(&::cuCtxGetDevice))                     \
  X(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", decltype(&::cuDeviceGetPCIBusId))      \
  X(IpcGetMemHandle, "cuIpcGetMemHandle", decltype(&::cuIpcGetMemHandle))            \
  X(IpcOpenMemHandleV1, "cuIpcOpenMemHandle", IpcOpenMemHandleV1Fn)                  \
  X(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", decltype(&::cuIpcOpenMemHandle_v2))   \
  X(IpcCloseMemHandle, "cuIpcCloseMemHandle", decltype(&::cuIpcCloseMemHandle))      \
  X(MemCreate, "cuMemCreate", decltype(&::cuMemCreate))                              \
  X(MemRelease, "cuMemRelease", decltype(&::cuMemRelease))                           \
  X(MemAddressReserve, "cuMemAddressReserve", decltype(&::cuMemAddressReserve))      \
  X(MemAddressFree, "cuMemAddressFree", decltype(&::cuMemAddressFree))               \
  X(MemMap, "cuMemMap", decltype(&::cuMemMap))                                       \
  X(MemUnmap, "cuMemUnmap", decltype(&::cuMemUnmap))                                 \
  X(MemSetAccess, "cuMemSetAccess", decltype(&::cuMemSetAccess))                     \
  X(MemExportToShareableHandle, "cuMemExportToShareableHandle",                      \
    decltype(&::cuMemExportToShareableHandle))                                       \
  X(MemImportFromShareableHandle, "cuMemImportFromShareableHandle",                  \
    decltype(&::cuMemImportFromShareableHandle))                                     \
  X(MemRetainAllocationHandle, "cuMemRetainAllocationHandle",                        \
    decltype(&::cuMemRetainAllocationHandle))                                        \
  X(MemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle",  \
    decltype(&::cuMemGetAllocationPropertiesFromHandle))                             \
  X(MemGetAddressRangeV1, "cuMemGetAddressRange", MemGetAddressRangeV1Fn)            \
  X(MemGetAddressRange, "cuMemGetAddressRange_v2", decltype(&::cuMemGetAddressRange_v2)) \
  X(PointerGetAttribute, "cuPointerGetAttribute", decltype(&::cuPointerGetAttribute)) \
  X(PointerGetAttributes, "cuPointerGetAttributes", decltype(&::cuPointerGetAttributes)) \
  X(GetProcAddressV1, "cuGetProcAddress", GetProcAddressV1Fn)                        \
  X(GetProcAddress, "cuGetProcAddress_v2", decltype(&::cuGetProcAddress_v2))

struct RealDriver {
#define VMMIPC_DRIVER_MEMBER(member, symbol, type) type member = nullptr;
  VMMIPC_DRIVER_FUNCTIONS(VMMIPC_DRIVER_MEMBER)
#undef VMMIPC_DRIVER_MEMBER
  void* library = nullptr;  // dlopen handle of the real libcuda
};

// The loaded table; loads it on the first call. Never null: when the library
// cannot be loaded, or its entry points are vmmipc's own (it would call itself
// forever), the table's entries are null and Loaded() is false.
const RealDriver& Real();
bool Loaded();
// What VMMIPC_REAL returns for a null entry point: CUDA_ERROR_NOT_SUPPORTED,
// with an error line when the driver loaded without it.
CUresult MissingEntryPoint(const char* member);
// Human name of a CUresult for log lines ("CUDA_ERROR_INVALID_VALUE (1)").
const char* ErrorName(CUresult result);

}  // namespace vmmipc::driver

// Calls a real driver function that might be missing from an old libcuda:
// a missing entry point is CUDA_ERROR_NOT_SUPPORTED, never a null call.
#define VMMIPC_REAL(member, ...)                                                             \
  (::vmmipc::driver::Real().member != nullptr ? ::vmmipc::driver::Real().member(__VA_ARGS__) \
                                              : ::vmmipc::driver::MissingEntryPoint(#member))

// Logs one line naming the failed driver call and returns its CUresult.
#define VMMIPC_CU_CHECK(member, ...)                                                      \
  do {                                                                                    \
    const CUresult vmmipc_cu_status_ = VMMIPC_REAL(member, __VA_ARGS__);                  \
    if (vmmipc_cu_status_ != CUDA_SUCCESS) {                                              \
      VMMIPC_LOG_WARN("{} failed: {} ({}:{})", #member,                                   \
                      ::vmmipc::driver::ErrorName(vmmipc_cu_status_), __FILE__, __LINE__); \
      return vmmipc_cu_status_;                                                           \
    }                                                                                     \
  } while (0)
