// Export ahead: a chunk's fd exported into the cache before its first
// request, in get or on a listener worker, so that the importer's open finds
// an fd to dup instead of waiting for the export, and the export does not run
// while peers import (measured: an export beside a peer's imports doubles
// their driver time).
#include "core/export/export_ahead.h"

#include <optional>
#include <vector>

#include "common/log.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/fd_cache_limit.h"

namespace vmmipc::core {
namespace {

// Exports the chunk at `address` into the cache unless it is there already.
// An export costs tens of microseconds, and the process's first export (or
// the first after every exported chunk was unmapped) far more for the
// driver's export set-up (docs/driver-behaviour.md#export-cliff). Frameworks
// get every handle, exchange them, then open.
void ExportAhead(uint64_t address) {
  ExportSide& exporter = Exporter();
  std::optional<ledger::VmmMapping> chunk = exporter.mappings().Find(address);
  if (!chunk || chunk->fd_cached || !chunk->posix_fd_exportable) return;
  ScopedFd fd;  // the dup FdForChunk hands back; only the cached copy is kept
  if (FdForChunk(exporter, *chunk, &fd) != CUDA_SUCCESS)
    VMMIPC_LOG_DEBUG(
        "exporting 0x{:x} ahead of its first request failed; it will be exported "
        "when asked",
        chunk->base);
}

// Exports every queued chunk, then lets the next get post a new drain.
void DrainExportAhead() {
  ExportSide& exporter = Exporter();
  UseExportContext(exporter);
  std::vector<uint64_t> batch;
  while (exporter.TakeExportAhead(&batch))
    for (uint64_t address : batch) ExportAhead(address);
}

}  // namespace

void ExportInGet(uint64_t address) noexcept {
  try {
    ExportAhead(address);
  } catch (...) {
    // Out of memory in the table: the first request exports it instead.
    VMMIPC_LOG_DEBUG("exporting 0x{:x} in get failed; it will be exported when asked", address);
  }
}

void QueueExportAhead(ExportSide& exporter, uint64_t address) noexcept {
  if (!exporter.QueueExportAhead(address)) return;
  try {
    exporter.listener().Post(DrainExportAhead);
  } catch (...) {
    exporter.DropExportAhead();
  }
}

// Only while the cache is under half full: exports no one asked for yet never
// evict the fds of chunks that were asked for.
void ExportAheadOfMap(ExportSide& exporter, uint64_t base) noexcept {
  if (!exporter.listener_ready()) return;  // never shared: nothing to prepare for
  const size_t limit = FdCacheLimit(config::Get().export_fd_cache);
  if (exporter.mappings().cached_fd_count() >= limit / 2) return;
  QueueExportAhead(exporter, base);
}

}  // namespace vmmipc::core
