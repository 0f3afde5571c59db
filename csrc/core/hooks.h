// The core functions behind the hooked entry points (driver/entry_points.h
// names each), the one header entry includes besides core/real.h. entry turns
// C calls into these, inside a noexcept boundary; each returns the CUresult the
// caller sees. entry calls them only when Active(): otherwise the call goes
// straight to the real driver, so they never check it again.
#pragma once

#include <cuda.h>

namespace vmmipc::core {

// False when VMMIPC_ENABLE=0 or the driver cannot be loaded: hooks pass
// through. Decided on the first call, the same for the life of the process.
bool Active();

CUresult IpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr address);
// `v2` picks the real entry point a foreign handle is forwarded to.
CUresult IpcOpenMemHandle(CUdeviceptr* pointer, const CUipcMemHandle& handle, unsigned int flags,
                          bool v2);
// The application's open, as entry's hooks call it: IpcOpenMemHandle with the
// background export paused for its length (core/open_hook.cc).
CUresult ApplicationOpen(CUdeviceptr* pointer, const CUipcMemHandle& handle, unsigned int flags,
                         bool v2);
// The two ABIs of cuIpcOpenMemHandle, as entry's hooks call them.
inline CUresult IpcOpenMemHandleV1(CUdeviceptr* pointer, CUipcMemHandle handle,
                                   unsigned int flags) {
  return ApplicationOpen(pointer, handle, flags, false);
}
inline CUresult IpcOpenMemHandle(CUdeviceptr* pointer, CUipcMemHandle handle, unsigned int flags) {
  return ApplicationOpen(pointer, handle, flags, true);
}
CUresult IpcCloseMemHandle(CUdeviceptr pointer);

CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags);
CUresult MemRelease(CUmemGenericAllocationHandle handle);
// Mapping tracking: own VMM mappings are recorded so that get needs no driver call.
CUresult MemMap(CUdeviceptr pointer, size_t size, size_t offset,
                CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult MemUnmap(CUdeviceptr pointer, size_t size);

CUresult PointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer);
CUresult PointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                              CUdeviceptr pointer);
// The export arena (core/arena/export_arena.cc).
CUresult MemAddressReserve(CUdeviceptr* pointer, size_t size, size_t alignment, CUdeviceptr address,
                           unsigned long long flags);
CUresult MemAddressFree(CUdeviceptr pointer, size_t size);

CUresult MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr pointer);
// The 32-bit v1 ABI cannot address VMM memory: straight to the driver.
CUresult MemGetAddressRangeV1(unsigned int* base, unsigned int* size, unsigned int pointer);

}  // namespace vmmipc::core
