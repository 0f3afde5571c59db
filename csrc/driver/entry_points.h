// Every entry point of the real driver that vmmipc uses, declared once. This
// one list drives the real-driver table (driver/real_driver.h) and, for the
// hooked ones, the exported definitions (entry/exports.cc), the dlsym answers
// and the cuGetProcAddress substitutions (entry/hook_table.cc), and the linker
// version script (csrc/CMakeLists.txt reads the HOOK names from this file).
//
//   CALL(symbol, Member, (parameters))
//     called through the table, not hooked: programs reach the driver's own.
//   HOOK(symbol, Member, proc, since, until, (parameters), (arguments))
//     exported under `symbol`; the hook calls core::Member(arguments) (or
//     entry's own Member: entry/exports.cc) and the real one is Real().Member.
//     cuGetProcAddress(proc, version) answers this hook when
//     since <= version < until (kNoLimit: no upper bound).
//
// Adding a hook: one HOOK line here and core::Member. Signatures are checked
// against cuda.h where it declares the symbol under that name
// (driver/real_driver.cc for CALL; the compiler for the exported definitions
// of HOOK); the v1 ABIs, which cuda.h renames to _v2, are spelled out here.
// A list macro rather than a .def file so that entry reaches it through
// core/real.h, not by including driver/ (docs/architecture.md).
#pragma once

// clang-format off
#define VMMIPC_DRIVER_ENTRY_POINTS(CALL, HOOK) \
  CALL(cuGetErrorName, GetErrorName, (CUresult error, const char** name)) \
  CALL(cuCtxGetCurrent, CtxGetCurrent, (CUcontext* context)) \
  CALL(cuCtxSetCurrent, CtxSetCurrent, (CUcontext context)) \
  CALL(cuCtxGetDevice, CtxGetDevice, (CUdevice* device)) \
  CALL(cuDeviceGetPCIBusId, DeviceGetPCIBusId, (char* bus_id, int length, CUdevice device)) \
  CALL(cuMemSetAccess, MemSetAccess, (CUdeviceptr pointer, size_t size, const CUmemAccessDesc* descriptors, size_t count)) \
  CALL(cuMemExportToShareableHandle, MemExportToShareableHandle, (void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type, unsigned long long flags)) \
  CALL(cuMemImportFromShareableHandle, MemImportFromShareableHandle, (CUmemGenericAllocationHandle* handle, void* shareable, CUmemAllocationHandleType type)) \
  CALL(cuMemRetainAllocationHandle, MemRetainAllocationHandle, (CUmemGenericAllocationHandle* handle, void* address)) \
  CALL(cuMemGetAllocationPropertiesFromHandle, MemGetAllocationPropertiesFromHandle, (CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle)) \
  CALL(cuMemGetAllocationGranularity, MemGetAllocationGranularity, (size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option)) \
  HOOK(cuIpcGetMemHandle, IpcGetMemHandle, cuIpcGetMemHandle, 0, kNoLimit, (CUipcMemHandle* handle, CUdeviceptr pointer), (handle, pointer)) \
  HOOK(cuIpcOpenMemHandle, IpcOpenMemHandleV1, cuIpcOpenMemHandle, 0, 11000, (CUdeviceptr* pointer, CUipcMemHandle handle, unsigned int flags), (pointer, handle, flags)) \
  HOOK(cuIpcOpenMemHandle_v2, IpcOpenMemHandle, cuIpcOpenMemHandle, 11000, kNoLimit, (CUdeviceptr* pointer, CUipcMemHandle handle, unsigned int flags), (pointer, handle, flags)) \
  HOOK(cuIpcCloseMemHandle, IpcCloseMemHandle, cuIpcCloseMemHandle, 0, kNoLimit, (CUdeviceptr pointer), (pointer)) \
  HOOK(cuMemCreate, MemCreate, cuMemCreate, 0, kNoLimit, (CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop, unsigned long long flags), (handle, size, prop, flags)) \
  HOOK(cuMemRelease, MemRelease, cuMemRelease, 0, kNoLimit, (CUmemGenericAllocationHandle handle), (handle)) \
  HOOK(cuMemAddressReserve, MemAddressReserve, cuMemAddressReserve, 0, kNoLimit, (CUdeviceptr* pointer, size_t size, size_t alignment, CUdeviceptr address, unsigned long long flags), (pointer, size, alignment, address, flags)) \
  HOOK(cuMemAddressFree, MemAddressFree, cuMemAddressFree, 0, kNoLimit, (CUdeviceptr pointer, size_t size), (pointer, size)) \
  HOOK(cuMemMap, MemMap, cuMemMap, 0, kNoLimit, (CUdeviceptr pointer, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags), (pointer, size, offset, handle, flags)) \
  HOOK(cuMemUnmap, MemUnmap, cuMemUnmap, 0, kNoLimit, (CUdeviceptr pointer, size_t size), (pointer, size)) \
  HOOK(cuPointerGetAttribute, PointerGetAttribute, cuPointerGetAttribute, 0, kNoLimit, (void* data, CUpointer_attribute attribute, CUdeviceptr pointer), (data, attribute, pointer)) \
  HOOK(cuPointerGetAttributes, PointerGetAttributes, cuPointerGetAttributes, 0, kNoLimit, (unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr pointer), (count, attributes, data, pointer)) \
  HOOK(cuMemGetAddressRange, MemGetAddressRangeV1, cuMemGetAddressRange, 0, 3020, (unsigned int* base, unsigned int* size, unsigned int pointer), (base, size, pointer)) \
  HOOK(cuMemGetAddressRange_v2, MemGetAddressRange, cuMemGetAddressRange, 3020, kNoLimit, (CUdeviceptr* base, size_t* size, CUdeviceptr pointer), (base, size, pointer)) \
  HOOK(cuGetProcAddress, GetProcAddressV1, cuGetProcAddress, 0, 12000, (const char* symbol, void** function, int version, cuuint64_t flags), (symbol, function, version, flags)) \
  HOOK(cuGetProcAddress_v2, GetProcAddress, cuGetProcAddress, 12000, kNoLimit, (const char* symbol, void** function, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status), (symbol, function, version, flags, status))
// clang-format on
