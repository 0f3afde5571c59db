// Simulated CUDA driver: pointer queries (cuMemGetAddressRange, cuPointerGetAttribute[s]) and
// cuMemGetInfo.
//
// Measured on the H200: cuMemGetAddressRange reports the one mapping (one cuMemMap call) that holds
// a VMM address, while CU_POINTER_ATTRIBUTE_RANGE_START_ADDR/RANGE_SIZE report the reservation, and
// IS_LEGACY_CUDA_IPC_CAPABLE is 0 on VMM memory, 1 on cuMemAlloc memory.
#include <cstring>

#include "sim_state.h"

using simcuda::FindContaining;
using simcuda::St;
using simcuda::State;

namespace {

enum class Kind { kUnknown, kVmm, kLegacy, kImport };

struct PtrInfo {
  Kind kind = Kind::kUnknown;
  uintptr_t range_base = 0;  // allocation, or the VMM reservation
  size_t range_size = 0;
  uintptr_t map_base = 0;  // allocation, or the one VMM mapping
  size_t map_size = 0;
  int device = 0;
  uint64_t buffer_id = 0;
  uint64_t block_id = 0;
  unsigned long long handle_types = 0;
  uint16_t access_bits = 0;  // VMM: the granule's per-device access
};

PtrInfo Lookup(State& s, uintptr_t p) {
  PtrInfo info;
  if (auto it = FindContaining(s.legacy, p); it != s.legacy.end()) {
    info.kind = Kind::kLegacy;
    info.range_base = info.map_base = it->first;
    info.range_size = info.map_size = it->second.size;
    info.device = it->second.device;
    info.buffer_id = info.block_id = it->second.id;
    return info;
  }
  if (auto it = FindContaining(s.imports, p); it != s.imports.end()) {
    info.kind = Kind::kImport;
    info.range_base = info.map_base = it->first;
    info.range_size = info.map_size = it->second.size;
    info.device = it->second.device;
    info.buffer_id = info.block_id = it->second.buffer_id;
    return info;
  }
  auto mit = FindContaining(s.mappings, p);
  if (mit == s.mappings.end()) return info;
  auto rit = FindContaining(s.reservations, mit->first);
  auto hit = s.handles.find(mit->second.handle);
  if (rit == s.reservations.end() || hit == s.handles.end()) return info;  // cannot happen
  info.kind = Kind::kVmm;
  info.range_base = rit->first;
  info.range_size = rit->second.size;
  info.map_base = mit->first;
  info.map_size = mit->second.size;
  info.device = hit->second.prop.location.id;
  info.buffer_id = mit->second.buffer_id;
  info.block_id = hit->second.block_id;
  info.handle_types = static_cast<unsigned long long>(hit->second.prop.requestedHandleTypes);
  info.access_bits = mit->second.access[(p - mit->first) / simcuda::kGranularity];
  return info;
}

// An attribute's raw value, read without an enum load (callers may pass values cuda.h lacks).
int RawAttribute(const CUpointer_attribute* attr) {
  int v = 0;
  static_assert(sizeof(v) == sizeof(*attr));
  std::memcpy(&v, attr, sizeof(v));
  return v;
}

template <typename T>
void Put(void* data, T value) {
  std::memcpy(data, &value, sizeof(T));
}

// Writes one attribute of a known pointer. Booleans are written as int (4 bytes).
CUresult WriteAttribute(State& s, const PtrInfo& info, int attr, void* data, uintptr_t p) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      Put<CUcontext>(data, &s.primary_ctx[info.device]);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      Put<unsigned int>(data, CU_MEMORYTYPE_DEVICE);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      Put<CUdeviceptr>(data, static_cast<CUdeviceptr>(p));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return CUDA_ERROR_INVALID_VALUE;  // device memory has no host pointer
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      Put<int>(data, 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      Put<unsigned long long>(data, info.buffer_id);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      Put<int>(data, info.device);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      Put<int>(data, info.kind == Kind::kLegacy ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      Put<CUdeviceptr>(data, static_cast<CUdeviceptr>(info.range_base));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      Put<size_t>(data, info.range_size);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      Put<int>(data, 1);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      Put<unsigned long long>(data, info.handle_types);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: {
      unsigned int flags = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      if (info.kind == Kind::kVmm) {
        int dev = simcuda::CurrentDevice(s);
        flags = (info.access_bits >> (2 * (dev < 0 ? info.device : dev))) & 3u;
      }
      Put<unsigned int>(data, flags);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      Put<CUmemoryPool>(data, nullptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      Put<size_t>(data, info.map_size);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      Put<void*>(data, reinterpret_cast<void*>(info.map_base));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      Put<unsigned long long>(data, info.block_id);
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The size of an attribute's value; 0 for attributes the simulator does not know.
size_t AttributeSize(int attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      return sizeof(int);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      return sizeof(CUmemoryPool);
    default:
      return 0;
  }
}

}  // namespace

extern "C" {

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemGetAddressRange"); r != CUDA_SUCCESS) return r;
  PtrInfo info = Lookup(s, static_cast<uintptr_t>(dptr));
  if (info.kind == Kind::kUnknown) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = static_cast<CUdeviceptr>(info.map_base);
  if (psize != nullptr) *psize = info.map_size;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(unsigned int* pbase, unsigned int* psize, unsigned int dptr) {
  return CUDA_ERROR_NOT_SUPPORTED;  // 32-bit device pointers: not simulated
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuPointerGetAttribute"); r != CUDA_SUCCESS) return r;
  int attr = RawAttribute(&attribute);
  if (data == nullptr || AttributeSize(attr) == 0) return CUDA_ERROR_INVALID_VALUE;
  PtrInfo info = Lookup(s, static_cast<uintptr_t>(ptr));
  if (info.kind == Kind::kUnknown) return CUDA_ERROR_INVALID_VALUE;
  return WriteAttribute(s, info, attr, data, static_cast<uintptr_t>(ptr));
}

// Unlike cuPointerGetAttribute, a pointer the driver does not know is not an error: every value
// reads as zero/NULL (DEVICE_ORDINAL as -2, as for host memory). An attribute that does not apply
// to a known pointer (HOST_POINTER of device memory) also reads as zero.
CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuPointerGetAttributes"); r != CUDA_SUCCESS) return r;
  if (count == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] == nullptr || AttributeSize(RawAttribute(&attributes[i])) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  PtrInfo info = Lookup(s, static_cast<uintptr_t>(ptr));
  for (unsigned int i = 0; i < count; ++i) {
    int attr = RawAttribute(&attributes[i]);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (info.kind != Kind::kUnknown) {
      r = WriteAttribute(s, info, attr, data[i], static_cast<uintptr_t>(ptr));
    }
    if (r != CUDA_SUCCESS) {
      std::memset(data[i], 0, AttributeSize(attr));
      if (info.kind == Kind::kUnknown && attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
        Put<int>(data[i], -2);
      }
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemGetInfo"); r != CUDA_SUCCESS) return r;
  if (simcuda::CurrentDevice(s) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *free_bytes = s.total_mem - s.used_mem;
  *total_bytes = s.total_mem;
  return CUDA_SUCCESS;
}

}  // extern "C"
