// Simulated CUDA driver: legacy device memory (cuMemAlloc/cuMemFree), synchronous copies and
// memsets, and legacy CUDA IPC (cuIpcGetMemHandle/cuIpcOpenMemHandle/cuIpcCloseMemHandle).
//
// A cuMemAlloc allocation is a memfd (simcuda-legacy-<id>) the exporting process keeps open. Its
// IPC handle names the exporter's pid, that fd number and the memfd's inode; an importer opens
// /proc/<pid>/fd/<fd> (allowed for the same user and for root), checks the inode, and maps the
// file. Nothing is left in the file system when a process dies.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "sim_state.h"

using simcuda::FindContaining;
using simcuda::kGranularity;
using simcuda::LegacyAlloc;
using simcuda::LegacyImport;
using simcuda::St;
using simcuda::State;

namespace {

// The 64-byte handle, every byte defined, little-endian (x86-64 only).
struct WireHandle {
  char magic[8];      // "SIMLEG01"
  uint32_t pid;       // exporter
  int32_t fd;         // memfd in the exporter
  uint64_t id;        // allocation id in the exporter
  uint64_t size;      // requested size
  uint64_t mapped;    // mapped size
  uint64_t ino;       // memfd inode, checked by the importer
  uint64_t token;     // exporter's per-process random token
  uint32_t device;    // device ordinal
  uint32_t checksum;  // FNV-1a over bytes [0, 60)
};
static_assert(sizeof(WireHandle) == CU_IPC_HANDLE_SIZE);

uint32_t Fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

bool HasContext(const State& s) { return simcuda::CurrentDevice(s) >= 0; }

// Whether addr lies in anything the driver manages (a host pointer otherwise).
bool KnownAddress(State& s, uintptr_t addr) {
  return FindContaining(s.reservations, addr) != s.reservations.end() ||
         FindContaining(s.legacy, addr) != s.legacy.end() ||
         FindContaining(s.imports, addr) != s.imports.end();
}

// Maps `fd` read-write at a fresh 2 MiB-aligned address; 0 on failure.
uintptr_t MapShared(int fd, size_t size) {
  void* base = simcuda::ReserveAnywhere(size, kGranularity);
  if (base == nullptr) return 0;
  void* p = mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    munmap(base, size);
    return 0;
  }
  return reinterpret_cast<uintptr_t>(p);
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemAlloc"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize > SIZE_MAX - kGranularity) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t mapped = simcuda::RoundUp(bytesize, kGranularity);
  if (mapped > s.total_mem - s.used_mem) return CUDA_ERROR_OUT_OF_MEMORY;
  LegacyAlloc a;
  a.size = bytesize;
  a.mapped_size = mapped;
  a.device = simcuda::CurrentDevice(s);
  a.id = s.next_id++;
  char name[64];
  std::snprintf(name, sizeof(name), "%s%llu", simcuda::kLegacyMemfdPrefix,
                static_cast<unsigned long long>(a.id));
  a.fd = simcuda::MakeMemfd(name, mapped);
  if (a.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st;
  uintptr_t base = fstat(a.fd, &st) == 0 ? MapShared(a.fd, mapped) : 0;
  if (base == 0) {
    close(a.fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a.ino = st.st_ino;
  a.dev = st.st_dev;
  s.used_mem += mapped;
  s.legacy.emplace(base, a);
  *dptr = static_cast<CUdeviceptr>(base);
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemFree"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == 0) return CUDA_SUCCESS;
  auto it = s.legacy.find(static_cast<uintptr_t>(dptr));
  if (it == s.legacy.end()) return CUDA_ERROR_INVALID_VALUE;  // VMM, interior, unknown
  munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
  close(it->second.fd);
  s.used_mem -= it->second.mapped_size;
  s.legacy.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemcpyHtoD"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr || !simcuda::RangeAccessible(s, dst, n, true)) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemcpyDtoH"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr || !simcuda::RangeAccessible(s, src, n, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::memmove(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemcpyDtoD"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!simcuda::RangeAccessible(s, dst, n, true) || !simcuda::RangeAccessible(s, src, n, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

// Unified addressing: either side may be a host pointer; anything the driver manages must be
// accessible.
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemcpy"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == 0 || src == 0) return CUDA_ERROR_INVALID_VALUE;
  if (KnownAddress(s, dst) && !simcuda::RangeAccessible(s, dst, n, true)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (KnownAddress(s, src) && !simcuda::RangeAccessible(s, src, n, false)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemsetD8"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!simcuda::RangeAccessible(s, dst, n, true)) return CUDA_ERROR_INVALID_VALUE;
  std::memset(reinterpret_cast<void*>(dst), value, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuMemsetD32"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (dst % 4 != 0 || n > SIZE_MAX / 4 || !simcuda::RangeAccessible(s, dst, n * 4, true)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* p = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = 0; i < n; ++i) p[i] = value;
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuIpcGetMemHandle"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Measured: VMM memory (base or interior) is refused; so is anything not from cuMemAlloc.
  auto it = FindContaining(s.legacy, static_cast<uintptr_t>(dptr));
  if (it == s.legacy.end()) return CUDA_ERROR_INVALID_VALUE;
  const LegacyAlloc& a = it->second;
  WireHandle w;
  std::memset(&w, 0, sizeof(w));
  std::memcpy(w.magic, simcuda::kLegacyMagic, sizeof(w.magic));
  w.pid = static_cast<uint32_t>(getpid());
  w.fd = a.fd;
  w.id = a.id;
  w.size = a.size;
  w.mapped = a.mapped_size;
  w.ino = a.ino;
  w.token = s.token;
  w.device = static_cast<uint32_t>(a.device);
  w.checksum = Fnv1a(&w, offsetof(WireHandle, checksum));
  static_assert(sizeof(handle->reserved) == sizeof(w));
  std::memcpy(handle->reserved, &w, sizeof(w));
  return CUDA_SUCCESS;
}

}  // extern "C"

namespace {

CUresult OpenLegacy(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuIpcOpenMemHandle"); r != CUDA_SUCCESS) return r;
  if (pdptr == nullptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    return CUDA_ERROR_INVALID_VALUE;  // measured: flags 0 is refused
  }
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  WireHandle w;
  std::memcpy(&w, handle.reserved, sizeof(w));
  if (std::memcmp(w.magic, simcuda::kLegacyMagic, sizeof(w.magic)) != 0 ||
      w.checksum != Fnv1a(&w, offsetof(WireHandle, checksum)) || w.fd < 0 || w.size == 0 ||
      w.mapped < w.size || w.mapped % kGranularity != 0 || w.device >= simcuda::kMaxDevices) {
    return CUDA_ERROR_INVALID_VALUE;  // garbage, or another driver's handle
  }
  if (w.pid == static_cast<uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;  // measured
  for (auto& [base, imp] : s.imports) {
    if (imp.pid == w.pid && imp.id == w.id && imp.token == w.token) {
      ++imp.refs;  // measured: same pointer, reference counted
      *pdptr = static_cast<CUdeviceptr>(base);
      return CUDA_SUCCESS;
    }
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%u/fd/%d", w.pid, w.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // exporter gone, or the allocation freed
  struct stat st;
  uintptr_t base = 0;
  if (fstat(fd, &st) == 0 && st.st_ino == w.ino && static_cast<uint64_t>(st.st_size) == w.mapped) {
    base = MapShared(fd, w.mapped);
  }
  close(fd);
  if (base == 0) return CUDA_ERROR_INVALID_VALUE;
  LegacyImport imp;
  imp.size = w.size;
  imp.mapped_size = w.mapped;
  imp.refs = 1;
  imp.pid = w.pid;
  imp.id = w.id;
  imp.token = w.token;
  imp.device = static_cast<int>(w.device);
  imp.buffer_id = s.next_id++;
  s.imports.emplace(base, imp);
  *pdptr = static_cast<CUdeviceptr>(base);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  return OpenLegacy(pdptr, handle, flags);
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  return OpenLegacy(pdptr, handle, flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuIpcCloseMemHandle"); r != CUDA_SUCCESS) return r;
  if (!HasContext(s)) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = s.imports.find(static_cast<uintptr_t>(dptr));
  if (it == s.imports.end()) return CUDA_ERROR_INVALID_VALUE;  // measured: one close too many
  if (--it->second.refs == 0) {
    munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
    s.imports.erase(it);
  }
  return CUDA_SUCCESS;
}

}  // extern "C"
