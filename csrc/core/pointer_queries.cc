// The hooks of pointer queries:
//  - IS_LEGACY_CUDA_IPC_CAPABLE reports 1 on VMM memory vmmipc can export, so
//    callers that check it take the IPC path.
//  - range queries on imported pointers answer with the imported run, as the
//    driver does for a legacy IPC mapping (the allocation); on a carve of the
//    export arena, with the carve, as the driver does for a reservation.
#include "core/arena/export_arena.h"
#include "core/export/vmm_memory.h"
#include "core/hooks.h"
#include "core/process_state.h"
#include "core/real.h"

namespace vmmipc::core {
namespace {

// Rewrites one attribute the driver already answered. Returns true if it did.
bool Amend(CUpointer_attribute attribute, void* data, CUdeviceptr pointer) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      auto* capable = static_cast<int*>(data);
      if (*capable != 0) return false;
      ChunkInfo chunk;
      if (DescribeChunk(pointer, &chunk) != CUDA_SUCCESS || !chunk.posix_fd_exportable)
        return false;
      *capable = 1;
      return true;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      uint64_t base = 0, size = 0;
      ArenaCarveInfo carve;
      if (FindArenaCarve(pointer, &carve)) {
        // The driver sees one arena reservation; the program asked for this one.
        base = carve.base;
        size = carve.size;
      } else if (!State().importer.RunAt(pointer, &base, &size)) {
        return false;
      }
      if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *static_cast<CUdeviceptr*>(data) = base;
      else
        *static_cast<size_t*>(data) = size;
      return true;
    }
    default:
      return false;
  }
}

}  // namespace

CUresult PointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer) {
  const CUresult result = VMMIPC_REAL(PointerGetAttribute, data, attribute, pointer);
  if (result == CUDA_SUCCESS && data != nullptr) Amend(attribute, data, pointer);
  return result;
}

CUresult PointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                              CUdeviceptr pointer) {
  const CUresult result = VMMIPC_REAL(PointerGetAttributes, count, attributes, data, pointer);
  if (result != CUDA_SUCCESS || attributes == nullptr || data == nullptr) return result;
  for (unsigned int i = 0; i < count; ++i)
    if (data[i] != nullptr) Amend(attributes[i], data[i], pointer);
  return result;
}

CUresult MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr pointer) {
  uint64_t run_base = 0, run_size = 0;
  if (State().importer.RunAt(pointer, &run_base, &run_size)) {
    if (base != nullptr) *base = run_base;
    if (size != nullptr) *size = run_size;
    return CUDA_SUCCESS;
  }
  return VMMIPC_REAL(MemGetAddressRange, base, size, pointer);
}

CUresult MemGetAddressRangeV1(unsigned int* base, unsigned int* size, unsigned int pointer) {
  return VMMIPC_REAL(MemGetAddressRangeV1, base, size, pointer);
}

}  // namespace vmmipc::core
