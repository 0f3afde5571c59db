// Export ahead: a chunk's fd exported into the cache before its first
// request, in get, on a listener worker or on the background export's thread,
// so that the importer's open finds an fd to dup instead of waiting for the
// export, and the export does not run while peers import (measured: an export
// beside a peer's imports doubles their driver time).
#include "core/export/export_ahead.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "common/log.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/fd_cache_limit.h"
#include "core/real.h"
#include "core/stats.h"
#include "transport/serve/fd_budget.h"

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

// The background export's cap (BackgroundExportCap), measured again at most
// once a second: a count of /proc/self/fd costs a few syscalls per thousand
// fds. Only the export thread calls it.
size_t BackgroundCapNow(ExportSide& exporter) {
  static int64_t measured_ms = -1;
  static size_t cap = 0;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  if (measured_ms >= 0 && now_ms - measured_ms < 1000) return cap;
  measured_ms = now_ms;
  const size_t cached = exporter.mappings().cached_fd_count();
  const size_t limit = FdCacheLimit(config::Get().export_fd_cache);
  rlimit nofile{};
  const long open = transport::CountOpenFds();
  size_t free_fds = 0;  // unknown: nothing more (what the get exports instead is as today)
  if (open >= 0 && ::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    const size_t soft = nofile.rlim_cur == RLIM_INFINITY ? size_t{1} << 30 : nofile.rlim_cur;
    free_fds = soft > static_cast<size_t>(open) ? soft - static_cast<size_t>(open) : 0;
  }
  cap = BackgroundExportCap(limit, cached, free_fds);
  return cap;
}

// The background export's thread, one queued chunk: exported into the cache
// unless it is gone, re-created, cached already, or over the cap. Runs under
// the background export's fork lock (background_export.h); never throws.
void ExportQueued(const BackgroundExport::Chunk& queued) {
  try {
    ExportSide& exporter = Exporter();
    // The mapping thread's context, once per thread (the keep-alive's
    // allocation is made here when this is the process's first export).
    static thread_local bool context_set = false;
    if (!context_set) {
      context_set = true;
      if (void* context = exporter.background().context())
        (void)VMMIPC_REAL(CtxSetCurrent, static_cast<CUcontext>(context));
    }
    const std::optional<ledger::VmmMapping> chunk = exporter.mappings().Find(queued.base);
    if (!chunk || chunk->base != queued.base || chunk->generation != queued.generation) {
      VMMIPC_LOG_DEBUG("background export: 0x{:x} was unmapped before its export", queued.base);
      return;
    }
    if (chunk->fd_cached) return;  // its get or a request was first
    if (exporter.mappings().cached_fd_count() >= BackgroundCapNow(exporter)) {
      stats::Count(stats::Counter::kBackgroundLeftToGet);
      VMMIPC_LOG_DEBUG(
          "background export: 0x{:x} left to its get: {} exported fds are kept, the most it "
          "keeps (half of VMMIPC_EXPORT_FD_CACHE, a quarter of the free fds)",
          queued.base, exporter.mappings().cached_fd_count());
      return;
    }
    {
      ScopedFd dup;  // the caller's copy FdForChunk hands back: closed here, under the fork lock
      if (FdForChunk(exporter, *chunk, &dup) != CUDA_SUCCESS) {
        VMMIPC_LOG_DEBUG("background export: exporting 0x{:x} failed; it is exported at its get",
                         queued.base);
        return;
      }
    }
    const std::optional<ledger::VmmMapping> now = exporter.mappings().Find(queued.base);
    if (now && now->generation == queued.generation && now->fd_cached) {
      stats::Count(stats::Counter::kBackgroundExports);
      VMMIPC_LOG_DEBUG("background export: exported 0x{:x}", queued.base);
    } else {
      VMMIPC_LOG_DEBUG("background export: 0x{:x} was unmapped during its export; its fd is closed",
                       queued.base);
    }
  } catch (...) {
    // Out of memory in the table or the logger: the get exports it instead.
  }
}

}  // namespace

size_t BackgroundExportCap(size_t cache_limit, size_t cached, size_t free_fds) {
  return std::min(cache_limit / 2, cached + free_fds / 4);
}

BackgroundExport* BackgroundIfOn() {
  return config::Get().background_export ? &Exporter().background() : nullptr;
}

void ExportInBackground(ExportSide& exporter, const ledger::VmmMapping& mapping) noexcept {
  if (!mapping.posix_fd_exportable || mapping.offset != 0) return;  // get would refuse it
  BackgroundExport& background = exporter.background();
  CUcontext context = nullptr;
  // The context the thread will export in: the first mapping's (one driver call, once).
  if (!background.started()) (void)VMMIPC_REAL(CtxGetCurrent, &context);
  if (!background.Queue({mapping.base, mapping.generation}, ExportQueued, context))
    stats::Count(stats::Counter::kBackgroundLeftToGet);
}

void ExportInGet(uint64_t address) noexcept {
  try {
    // A get's export pauses the background export (its own chunk, if the
    // thread is exporting it now, is waited for in FdForChunk's stripe).
    BusyScope busy(BackgroundIfOn());
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

}  // namespace vmmipc::core
