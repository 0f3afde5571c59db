// At the first export: the export keep-alive.
//
// The driver sets up per-process export state when the process's count of
// live exported fds goes from 0 to 1 (paid by that export) and tears it down
// when the count returns to 0 (inside the last close()): the export cliff,
// docs/driver-behaviour.md#export-cliff. The exported-fd cache keeps a chunk's fd only while the
// chunk is mapped, so a process whose exported memory was all unmapped (a framework freeing between
// phases, a memory saver's pause) paid both again: the unmap that closed the
// last fd, then its next export. One exported fd of an allocation nobody maps,
// kept to the end, holds the count above 0.
//
// It runs before the first export leaves, on the thread that makes it (a
// listener thread), so the process's fds and allocations are what they will
// stay once its first share is answered. The fd table is no longer grown
// here: it was grown at load time (core/load_time.h), while the process had
// one thread. Here, in a multi-threaded process, the growth would wait for an
// RCU grace period (docs/driver-behaviour.md#fd-table-growth) on the first open's path, and
// for a library loaded late (dlopen'ed into a process that already runs
// threads) no thread is off every open's path at this point: such a process's
// table grows as fds are opened, as it would without vmmipc.
#include "core/export/export_keepalive.h"

#include "common/fd_table.h"
#include "common/log.h"
#include "config/params.h"
#include "core/device_memory.h"
#include "core/export/vmm_memory.h"
#include "core/load_time.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

// The smallest allocation the device makes, exported as a POSIX fd. Runs
// where the process's first export runs (a listener thread, in the export
// context). Every failure leaves nothing behind: exports then pay the set-up
// again after the last exported chunk is unmapped, as without the keep-alive.
bool MakeExportKeepAlive(ExportSide& exporter, int32_t device) {
  const CUmemAllocationProp prop = DeviceMemoryProp(device, /*posix_fd=*/true);
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  const char* step = "cuMemGetAllocationGranularity";
  CUresult result =
      VMMIPC_REAL(MemGetAllocationGranularity, &size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (result == CUDA_SUCCESS) {
    step = "cuMemCreate";
    result = VMMIPC_REAL(MemCreate, &handle, size, &prop, 0);
  }
  int raw = -1;
  if (result == CUDA_SUCCESS) {
    step = "cuMemExportToShareableHandle";
    result = VMMIPC_REAL(MemExportToShareableHandle, &raw, handle,
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (result != CUDA_SUCCESS) (void)VMMIPC_REAL(MemRelease, handle);
  }
  if (result != CUDA_SUCCESS) {
    VMMIPC_LOG_INFO(
        "export keep-alive: none ({} on device {}: {}); an export after every exported chunk was "
        "unmapped pays the driver's export set-up again",
        step, device, driver::ErrorName(result));
    return false;
  }
  exporter.HoldExportKeepAlive(handle, ScopedFd(raw));
  stats::Count(stats::Counter::kExportKeepAlives);
  VMMIPC_LOG_DEBUG("export keep-alive: kept an exported fd of {} of device {} until exit",
                   log::Bytes(size), device);
  return true;
}

// One debug line says what the warm-up did, and what the load time did to the
// fd table (its size read only then: a read of /proc/self/status).
void SayWarmedUp(const char* kept) {
  if (!log::Enabled(log::Level::kDebug)) return;
  VMMIPC_LOG_DEBUG("export warm-up done: fd table {} entries ({}, {} wanted); export keep-alive {}",
                   FdTableSize(), FdTableAtLoad(), FdTableSizeAtLoad(), kept);
}

}  // namespace

void WarmUpBeforeFirstExport(ExportSide& exporter, int32_t device) noexcept {
  exporter.WarmUpOnce([&exporter, device] {
    // The keep-alive first: its export pays the driver's set-up that this first
    // export would have paid, so the chunk's own is an ordinary export
    // (docs/driver-behaviour.md#export-cliff).
    const bool wanted = config::Get().export_keepalive && device >= 0;
    const char* kept = !wanted ? "off" : MakeExportKeepAlive(exporter, device) ? "kept" : "none";
    SayWarmedUp(kept);
  });
}

}  // namespace vmmipc::core
