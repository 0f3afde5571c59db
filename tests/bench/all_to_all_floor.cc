// The all-to-all's driver floor: export, fd copy, import, map, access, by
// hand with the real driver (all_to_all_floor.h).
#include "all_to_all_floor.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vmmipc_all_to_all {
namespace {

using vmmipc_bench::CuFailure;
using vmmipc_bench::Real;

constexpr char kFloorMagic[4] = {'F', 'L', 'R', '0'};

// The handle: magic, pid, chunk count, then one int32 fd number per chunk.
struct FloorHandle {
  char magic[4];
  int32_t pid;
  uint32_t chunks;
  int32_t fds[kFloorMaxChunks];
};
static_assert(sizeof(FloorHandle) == sizeof(CUipcMemHandle));

}  // namespace

bool FloorExport(const vmmipc_bench::OwnedBuffer& buffer, std::vector<int>* exported,
                 CUipcMemHandle* handle, std::string* error) {
  if (buffer.handles.empty() || buffer.handles.size() > kFloorMaxChunks) {
    *error = "the floor takes 1 to " + std::to_string(kFloorMaxChunks) + " chunks a buffer, not " +
             std::to_string(buffer.handles.size());
    return false;
  }
  FloorHandle h = {};
  std::memcpy(h.magic, kFloorMagic, sizeof(kFloorMagic));
  h.pid = static_cast<int32_t>(getpid());
  for (CUmemGenericAllocationHandle chunk : buffer.handles) {
    int fd = -1;
    const CUresult r =
        Real().export_shareable(&fd, chunk, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemExportToShareableHandle (floor)");
      return false;
    }
    exported->push_back(fd);
    h.fds[h.chunks++] = fd;
  }
  std::memcpy(handle, &h, sizeof(h));
  return true;
}

bool FloorTakeFds(const CUipcMemHandle& handle, std::vector<int>* fds, bool* not_permitted,
                  std::string* error) {
  FloorHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kFloorMagic, sizeof(kFloorMagic)) != 0 || h.chunks == 0 ||
      h.chunks > kFloorMaxChunks) {
    *error = "not a floor handle";
    return false;
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, h.pid, 0));
  if (pidfd < 0) {
    *not_permitted = errno == EPERM || errno == ENOSYS;
    *error = std::string("pidfd_open: ") + std::strerror(errno);
    return false;
  }
  for (uint32_t i = 0; i < h.chunks; ++i) {
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, h.fds[i], 0));
    if (fd < 0) {
      *not_permitted = errno == EPERM || errno == ENOSYS;
      *error = std::string("pidfd_getfd: ") + std::strerror(errno) +
               " (the floor copies the peer's exported fds; it needs ptrace rights over it)";
      close(pidfd);
      return false;
    }
    fds->push_back(fd);
  }
  close(pidfd);
  return true;
}

bool FloorReserve(uint64_t chunk_size, size_t chunks, FloorMapping* m, std::string* error) {
  m->total = chunk_size * chunks;
  const CUresult r = Real().address_reserve(&m->va, m->total, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    m->va = 0;
    *error = CuFailure(r, "cuMemAddressReserve (floor)");
    return false;
  }
  return true;
}

bool FloorImportAndMap(std::vector<int>* fds, uint64_t chunk_size, CUdevice device, FloorMapping* m,
                       std::string* error) {
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < fds->size() && r == CUDA_SUCCESS; ++i) {
    CUmemGenericAllocationHandle h = 0;
    r = Real().import_shareable(&h, reinterpret_cast<void*>(static_cast<uintptr_t>((*fds)[i])),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemImportFromShareableHandle (floor)");
      break;
    }
    m->handles.push_back(h);
  }
  // The import does not take the fd: vmmipc closes its copy after importing too.
  for (int fd : *fds) close(fd);
  fds->clear();
  while (r == CUDA_SUCCESS && m->mapped < m->handles.size()) {
    r = Real().map(m->va + m->mapped * chunk_size, chunk_size, 0, m->handles[m->mapped], 0);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemMap (floor)");
      break;
    }
    ++m->mapped;
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = Real().set_access(m->va, m->total, &access, 1);
    if (r != CUDA_SUCCESS) *error = CuFailure(r, "cuMemSetAccess (floor)");
  }
  return r == CUDA_SUCCESS;
}

void FloorRelease(FloorMapping* m, uint64_t chunk_size) {
  for (size_t i = 0; i < m->mapped; ++i) Real().unmap(m->va + i * chunk_size, chunk_size);
  for (CUmemGenericAllocationHandle h : m->handles) Real().release(h);
  if (m->va != 0) Real().address_free(m->va, m->total);
  *m = FloorMapping{};
}

}  // namespace vmmipc_all_to_all
