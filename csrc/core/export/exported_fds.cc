// The driver side of the exported-fd cache (ledger/vmm_mappings.h keeps the
// fds): an fd for a tracked chunk, a dup of the cached one, or exported once.
#include "core/export/exported_fds.h"

#include <sys/resource.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/export/export_keepalive.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

// Exports the allocation mapped at `base` as a POSIX fd.
CUresult ExportAt(uint64_t base, ScopedFd* fd) {
  CUmemGenericAllocationHandle handle = 0;
  VMMIPC_CU_CHECK(MemRetainAllocationHandle, &handle, reinterpret_cast<void*>(base));
  int raw = -1;
  const CUresult exported = VMMIPC_REAL(MemExportToShareableHandle, &raw, handle,
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)VMMIPC_REAL(MemRelease, handle);  // the retain's reference; the mapping keeps its own
  if (exported != CUDA_SUCCESS) return exported;
  stats::Count(stats::Counter::kFdsExported);
  fd->Reset(raw);
  return CUDA_SUCCESS;
}

}  // namespace

// An fd for one tracked chunk: a dup of the cached export when there is one
// (no driver call), else a fresh export that is cached for the next grant.
CUresult FdForChunk(ExportSide& exporter, const ledger::VmmMapping& chunk, ScopedFd* fd) {
  *fd = exporter.mappings().DupCachedFd(chunk.base, chunk.generation);
  if (fd->valid()) {
    stats::Count(stats::Counter::kFdCacheGrants);
    return CUDA_SUCCESS;
  }
  // Once per process, before the first export and outside the stripes (it
  // makes an allocation and exports it): the export keep-alive.
  WarmUpBeforeFirstExport(exporter, chunk.device);
  // Two answers missing the same chunk at once (peers opening together, or
  // the export ahead) would export it twice: one export per chunk, the
  // second waits and takes a dup. Striped by chunk address; never held
  // across anything but this chunk's export.
  static std::mutex export_stripes[16];
  std::lock_guard<std::mutex> stripe(export_stripes[(chunk.base >> 21) % 16]);
  *fd = exporter.mappings().DupCachedFd(chunk.base, chunk.generation);
  if (fd->valid()) {
    stats::Count(stats::Counter::kFdCacheGrants);
    return CUDA_SUCCESS;
  }
  ScopedFd exported;
  VMMIPC_RETURN_IF_ERROR(ExportAt(chunk.base, &exported));
  std::vector<ScopedFd> evicted;  // closed here, outside the table's lock
  *fd = exporter.mappings().CacheFd(chunk.base, chunk.generation, std::move(exported), &evicted);
  if (!evicted.empty()) stats::Count(stats::Counter::kFdCacheEvictions, evicted.size());
  return CUDA_SUCCESS;
}

// Runs on a listener worker. It has no context of its own: use the one the
// first export ran in, once per thread (export works without one, measured,
// but the range queries were not measured that way).
void UseExportContext(const ExportSide& exporter) {
  static thread_local bool context_set = false;
  if (!context_set && exporter.export_context() != nullptr) {
    context_set = VMMIPC_REAL(CtxSetCurrent, static_cast<CUcontext>(exporter.export_context())) ==
                  CUDA_SUCCESS;
  }
}

}  // namespace vmmipc::core
