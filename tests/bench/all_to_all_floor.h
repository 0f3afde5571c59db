// The driver's floor of the all-to-all (Kind::kFloor): the same buffers as
// vmmipc's, registered by hand with the real driver's entry points (past any
// preloaded hook) and the fds in hand before the clock starts. The exporter
// exports each chunk's POSIX fd once and keeps it (as vmmipc keeps its
// exported fds); its "handle" names its pid and those fd numbers; the
// importer takes copies of them with pidfd_getfd and reserves each buffer's
// range, untimed, then times what no IPC layer can avoid: import each chunk,
// close its fd, map it, one cuMemSetAccess over the buffer.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.h"

namespace vmmipc_all_to_all {

// At most this many chunks per buffer fit a 64-byte floor handle.
constexpr uint64_t kFloorMaxChunks = 13;

// Exports every chunk of `buffer` (fds appended to `exported`, kept open by
// the caller until the buffer is freed) and packs the floor handle.
bool FloorExport(const vmmipc_bench::OwnedBuffer& buffer, std::vector<int>* exported,
                 CUipcMemHandle* handle, std::string* error);

// An importer's copy of a peer's chunk fds, taken with pidfd_getfd. False
// with *error; *not_permitted when the kernel refused the copy (no ptrace
// rights over the peer: Yama, seccomp, another user).
bool FloorTakeFds(const CUipcMemHandle& handle, std::vector<int>* fds, bool* not_permitted,
                  std::string* error);

// One buffer of a peer as the floor maps it.
struct FloorMapping {
  CUdeviceptr va = 0;
  uint64_t total = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  size_t mapped = 0;  // chunks mapped, from va on
};

// Untimed: reserves the range of `chunks` x `chunk_size`.
bool FloorReserve(uint64_t chunk_size, size_t chunks, FloorMapping* m, std::string* error);
// Timed: import each fd (closed after), map, set access for `device`. On
// failure what was done stays in `m` for FloorRelease.
bool FloorImportAndMap(std::vector<int>* fds, uint64_t chunk_size, CUdevice device, FloorMapping* m,
                       std::string* error);
// Unmap, release, free the range; the fds left in `fds` are closed too.
void FloorRelease(FloorMapping* m, uint64_t chunk_size);

}  // namespace vmmipc_all_to_all
