// Simulated CUDA driver: the virtual memory management API (cuMemCreate, cuMemAddressReserve,
// cuMemMap, cuMemSetAccess, export/import of POSIX fds, retain, properties).
//
// A physical chunk is a memfd named simcuda-vmm-d<device>-<id>; export hands out a CLOEXEC dup of
// it, import dups the given fd and checks by name that it is one of ours. A mapping stays
// PROT_NONE until cuMemSetAccess grants access, as on the GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "sim_introspect.h"
#include "sim_state.h"

using simcuda::FindContaining;
using simcuda::IsAligned;
using simcuda::kGranularity;
using simcuda::Mapping;
using simcuda::PhysHandle;
using simcuda::St;
using simcuda::State;

namespace {

using HandleIt = std::map<CUmemGenericAllocationHandle, PhysHandle>::iterator;

// A handle the caller still holds a reference to (released handles are invalid to the caller even
// while a mapping keeps the chunk alive).
HandleIt FindUserHandle(State& s, CUmemGenericAllocationHandle handle) {
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.user_refs == 0) return s.handles.end();
  return it;
}

bool ValidProp(const State& s, const CUmemAllocationProp* prop) {
  return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         simcuda::ValidDevice(s, prop->location.id);
}

CUmemGenericAllocationHandle NewHandle(State& s, PhysHandle h) {
  CUmemGenericAllocationHandle value = s.next_handle++;
  h.block_id = s.next_id++;
  s.handles.emplace(value, h);
  return value;
}

int ProtFor(uint16_t bits) {
  int prot = PROT_NONE;
  for (int d = 0; d < simcuda::kMaxDevices; ++d) {
    unsigned f = (bits >> (2 * d)) & 3u;
    if (f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return PROT_READ | PROT_WRITE;
    if (f == CU_MEM_ACCESS_FLAGS_PROT_READ) prot = PROT_READ;
  }
  return prot;
}

// Whether [ptr, ptr + size) is exactly a run of whole, back-to-back mappings.
bool WholeMappings(State& s, uintptr_t ptr, size_t size) {
  uintptr_t cur = ptr;
  while (cur < ptr + size) {
    auto it = s.mappings.find(cur);
    if (it == s.mappings.end() || it->second.size > ptr + size - cur) return false;
    cur += it->second.size;
  }
  return true;
}

// Whether [ptr, ptr + size) is covered by mappings without a gap (not necessarily whole ones).
bool FullyMapped(State& s, uintptr_t ptr, size_t size) {
  uintptr_t cur = ptr;
  while (cur < ptr + size) {
    auto it = FindContaining(s.mappings, cur);
    if (it == s.mappings.end()) return false;
    cur = it->first + it->second.size;
  }
  return true;
}

}  // namespace

extern "C" {

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemGetAllocationGranularity"); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || !ValidProp(s, prop)) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemCreate"); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!simcuda::ValidDevice(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (size == 0 || !IsAligned(size, kGranularity)) return CUDA_ERROR_INVALID_VALUE;
  unsigned types = static_cast<unsigned>(prop->requestedHandleTypes);
  if (types & CU_MEM_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_PERMITTED;  // no IMEX channel
  if (types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    return CUDA_ERROR_INVALID_VALUE;  // Win32 handle types on Linux
  }
  if (size > s.total_mem - s.used_mem) return CUDA_ERROR_OUT_OF_MEMORY;
  char name[64];
  std::snprintf(name, sizeof(name), "%s%d-%llu", simcuda::kVmmMemfdPrefix, prop->location.id,
                static_cast<unsigned long long>(s.next_id));
  int fd = simcuda::MakeMemfd(name, size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  PhysHandle h;
  h.fd = fd;
  h.size = size;
  h.prop = *prop;
  h.posix_exportable = (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  h.user_refs = 1;
  s.used_mem += size;
  *handle = NewHandle(s, h);
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemRelease"); r != CUDA_SUCCESS) return r;
  auto it = FindUserHandle(s, handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  --it->second.user_refs;
  simcuda::MaybeFreeHandle(s, it);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemAddressReserve"); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || !IsAligned(size, kGranularity)) return CUDA_ERROR_INVALID_VALUE;
  if (alignment != 0 && !IsAligned(alignment, alignment)) return CUDA_ERROR_INVALID_VALUE;
  size_t align = alignment > kGranularity ? alignment : kGranularity;
  if (addr != 0 && (addr > simcuda::kUserTop || size > simcuda::kUserTop - addr)) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // the hint cannot fit in the user address space
  }
  void* got = nullptr;
  // Measured: reservations under 64 MiB ignore the hint; larger ones get it when it is free.
  if (addr != 0 && size >= simcuda::kHintMinSize && IsAligned(addr, align)) {
    void* want = reinterpret_cast<void*>(addr);
    void* p = mmap(want, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == want) {
      got = p;
    } else if (p != MAP_FAILED) {
      munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
    }
  }
  if (got == nullptr) got = simcuda::ReserveAnywhere(size, align);
  if (got == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t base = reinterpret_cast<uintptr_t>(got);
  s.reservations[base] = simcuda::Reservation{size};
  *ptr = static_cast<CUdeviceptr>(base);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemAddressFree"); r != CUDA_SUCCESS) return r;
  auto it = s.reservations.find(static_cast<uintptr_t>(ptr));
  if (it == s.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  if (simcuda::AnyOverlap(s.mappings, static_cast<uintptr_t>(ptr), size)) {
    return CUDA_ERROR_INVALID_VALUE;  // measured: something is still mapped in it
  }
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  State& s = St();
  simcuda::DelayIfAsked(s, "cuMemMap");
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemMap"); r != CUDA_SUCCESS) return r;
  uintptr_t base = static_cast<uintptr_t>(ptr);
  if (flags != 0 || size == 0 || !IsAligned(base, kGranularity) || !IsAligned(size, kGranularity) ||
      !IsAligned(offset, kGranularity) || base + size < base) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto hit = FindUserHandle(s, handle);
  if (hit == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  PhysHandle& h = hit->second;
  if (offset > h.size || size > h.size - offset) return CUDA_ERROR_INVALID_VALUE;
  auto rit = FindContaining(s.reservations, base);
  if (rit == s.reservations.end() || size > rit->second.size - (base - rit->first)) {
    return CUDA_ERROR_INVALID_VALUE;  // must lie inside one reservation
  }
  if (simcuda::AnyOverlap(s.mappings, base, size)) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(reinterpret_cast<void*>(base), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h.fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    simcuda::Unreserve(base, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = handle;
  m.buffer_id = s.next_id++;
  m.access.assign(size / kGranularity, 0);
  s.mappings.emplace(base, std::move(m));
  ++h.map_refs;
  return CUDA_SUCCESS;
}

// -Bsymbolic binds this call to the simulator's own cuMemMap, never to a preloaded hook.
extern "C" int simcuda_mem_map(uint64_t ptr, uint64_t size, uint64_t offset, uint64_t handle) {
  return static_cast<int>(cuMemMap(ptr, size, offset, handle, 0));
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  State& s = St();
  simcuda::DelayIfAsked(s, "cuMemUnmap");
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemUnmap"); r != CUDA_SUCCESS) return r;
  uintptr_t base = static_cast<uintptr_t>(ptr);
  if (size == 0 || base + size < base || !WholeMappings(s, base, size)) {
    return CUDA_ERROR_INVALID_VALUE;  // measured: part of a mapping cannot be unmapped
  }
  uintptr_t cur = base;
  while (cur < base + size) {
    auto it = s.mappings.find(cur);
    size_t msize = it->second.size;
    simcuda::Unreserve(cur, msize);
    auto hit = s.handles.find(it->second.handle);
    s.mappings.erase(it);
    if (hit != s.handles.end()) {
      --hit->second.map_refs;
      simcuda::MaybeFreeHandle(s, hit);
    }
    cur += msize;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemSetAccess"); r != CUDA_SUCCESS) return r;
  uintptr_t base = static_cast<uintptr_t>(ptr);
  if (desc == nullptr || count == 0 || size == 0 || base + size < base ||
      !IsAligned(base, kGranularity) || !IsAligned(size, kGranularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!simcuda::ValidDevice(s, desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    CUmemAccess_flags f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (!FullyMapped(s, base, size)) return CUDA_ERROR_INVALID_VALUE;
  for (uintptr_t cur = base; cur < base + size; cur += kGranularity) {
    auto it = FindContaining(s.mappings, cur);
    uint16_t& bits = it->second.access[(cur - it->first) / kGranularity];
    for (size_t i = 0; i < count; ++i) {
      int shift = 2 * desc[i].location.id;
      bits = static_cast<uint16_t>((bits & ~(3u << shift)) |
                                   (static_cast<unsigned>(desc[i].flags) << shift));
    }
    if (mprotect(reinterpret_cast<void*>(cur), kGranularity, ProtFor(bits)) != 0) {
      return CUDA_ERROR_UNKNOWN;
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemGetAccess"); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!simcuda::ValidDevice(s, location->id)) return CUDA_ERROR_INVALID_DEVICE;
  auto it = FindContaining(s.mappings, static_cast<uintptr_t>(ptr));
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  uint16_t bits = it->second.access[(static_cast<uintptr_t>(ptr) - it->first) / kGranularity];
  *flags = (bits >> (2 * location->id)) & 3u;
  return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags) {
  State& s = St();
  simcuda::DelayIfAsked(s, "cuMemExportToShareableHandle");
  std::unique_lock<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemExportToShareableHandle"); r != CUDA_SUCCESS) return r;
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = FindUserHandle(s, handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  // Measured: POSIX only when requested at creation; FABRIC never (no IMEX channel).
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !it->second.posix_exportable) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  lock.unlock();
  simcuda::DelayAfterIfAsked(s, "cuMemExportToShareableHandle");
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  State& s = St();
  simcuda::DelayIfAsked(s, "cuMemImportFromShareableHandle");
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemImportFromShareableHandle"); r != CUDA_SUCCESS) {
    return r;
  }
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_MEM_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_PERMITTED;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  intptr_t raw = reinterpret_cast<intptr_t>(os_handle);
  if (raw < 0 || raw > INT_MAX) return CUDA_ERROR_INVALID_VALUE;
  // Only a chunk of this simulator: its memfd name says so, and which device it lives on.
  char link_path[64];
  char target[256];
  std::snprintf(link_path, sizeof(link_path), "/proc/self/fd/%d", static_cast<int>(raw));
  ssize_t n = readlink(link_path, target, sizeof(target) - 1);
  if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
  target[n] = '\0';
  std::string prefix = std::string("/memfd:") + simcuda::kVmmMemfdPrefix;
  int device = -1;
  if (std::strncmp(target, prefix.c_str(), prefix.size()) != 0 ||
      std::sscanf(target + prefix.size(), "%d-", &device) != 1 ||
      !simcuda::ValidDevice(s, device)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct stat st;
  if (fstat(static_cast<int>(raw), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      !IsAligned(static_cast<uint64_t>(st.st_size), kGranularity)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = fcntl(static_cast<int>(raw), F_DUPFD_CLOEXEC, 0);  // the caller keeps its fd
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  PhysHandle h;
  h.fd = fd;
  h.size = static_cast<size_t>(st.st_size);
  h.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  h.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;  // measured: reads 0 on imports
  h.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  h.prop.location.id = device;
  h.imported = true;
  h.posix_exportable = true;
  h.user_refs = 1;
  *handle = NewHandle(s, h);
  return CUDA_SUCCESS;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemRetainAllocationHandle"); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = FindContaining(s.mappings, reinterpret_cast<uintptr_t>(addr));
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  auto hit = s.handles.find(it->second.handle);
  if (hit == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  ++hit->second.user_refs;
  *handle = hit->first;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemGetAllocationPropertiesFromHandle"); r != CUDA_SUCCESS) {
    return r;
  }
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = FindUserHandle(s, handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

}  // extern "C"
