// VMM memory queries through the real driver table.
#include "core/export/vmm_memory.h"

#include "common/log.h"
#include "core/arena/export_arena.h"
#include "core/device_memory.h"
#include "core/export/export_side.h"
#include "core/real.h"
#include "driver/status.h"

namespace vmmipc::core {

CUresult ExportRegionOf(uint64_t address, uint64_t* region_base, uint64_t* region_end) {
  ArenaCarveInfo carve;
  if (FindArenaCarve(address, &carve)) {
    *region_base = carve.arena_base;
    *region_end = carve.base + carve.size;
    return CUDA_SUCCESS;
  }
  uint64_t base = 0, size = 0;
  VMMIPC_RETURN_IF_ERROR(RegionOf(address, &base, &size));
  *region_base = base;
  *region_end = base + size;
  return CUDA_SUCCESS;
}

bool DescribeTracked(uint64_t address, ChunkInfo* info) {
  std::optional<ledger::VmmMapping> mapping = Exporter().mappings().Find(address);
  if (!mapping) return false;
  info->base = mapping->base;
  info->size = mapping->size;
  info->offset = mapping->offset;
  info->generation = mapping->generation;
  info->posix_fd_exportable = mapping->posix_fd_exportable;
  info->device = mapping->device;
  info->region_base = mapping->region_base;
  info->region_end = mapping->region_end;
  info->export_cached = mapping->fd_cached;
  return true;
}

CUresult RetainedChunk::Retain(uint64_t address) {
  Reset();
  // cuMemRetainAllocationHandle is the driver's own test for "VMM memory":
  // it fails on cuMemAlloc memory and on reserved-but-unmapped space (measured).
  if (VMMIPC_REAL(MemRetainAllocationHandle, &handle_, reinterpret_cast<void*>(address)) !=
      CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  held_ = true;
  if (DescribeTracked(address, &info_)) return CUDA_SUCCESS;
  CUmemAllocationProp prop = {};
  const CUresult props = VMMIPC_REAL(MemGetAllocationPropertiesFromHandle, &prop, handle_);
  info_.generation = Exporter().generations().GetOrAssign(handle_);
  info_.posix_fd_exportable =
      props == CUDA_SUCCESS &&
      (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  info_.device = DeviceOf(props == CUDA_SUCCESS ? &prop : nullptr);
  CUdeviceptr base = 0;
  size_t size = 0;
  // On VMM memory this is the one mapping (the chunk), not the reservation.
  if (VMMIPC_REAL(MemGetAddressRange, &base, &size, address) != CUDA_SUCCESS || size == 0) {
    Reset();
    return CUDA_ERROR_INVALID_VALUE;
  }
  info_.base = base;
  info_.size = size;
  if (ExportRegionOf(address, &info_.region_base, &info_.region_end) != CUDA_SUCCESS) {
    Reset();
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

void RetainedChunk::Reset() {
  // The retain took a reference on the allocation: give it back.
  if (held_) (void)VMMIPC_REAL(MemRelease, handle_);
  held_ = false;
  handle_ = 0;
  info_ = ChunkInfo();
}

CUresult DescribeChunk(uint64_t address, ChunkInfo* info) {
  if (DescribeTracked(address, info)) return CUDA_SUCCESS;
  RetainedChunk chunk;
  VMMIPC_RETURN_IF_ERROR(chunk.Retain(address));
  *info = chunk.info();
  return CUDA_SUCCESS;
}

CUresult RegionOf(uint64_t address, uint64_t* base, uint64_t* size) {
  // On VMM memory the range attributes report the reservation (measured).
  CUdeviceptr start = 0;
  size_t bytes = 0;
  VMMIPC_CU_CHECK(PointerGetAttribute, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address);
  VMMIPC_CU_CHECK(PointerGetAttribute, &bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, address);
  *base = start;
  *size = bytes;
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
