// Export ahead: chunks exported into the exported-fd cache before their first
// request, by get itself (VMMIPC_EXPORT_IN_GET), queued and drained by one
// listener task at a time, or, from their map on, by the background export
// (VMMIPC_BACKGROUND_EXPORT, core/export/background_export.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/export/export_side.h"
#include "ledger/vmm_mappings.h"

namespace vmmipc::core {

// Called by get for a chunk whose fd is not cached yet: queues it for a
// listener worker. Get itself only pushes an address (and posts one task per
// batch). Best effort: a chunk not queued is exported when first requested.
void QueueExportAhead(ExportSide& exporter, uint64_t address) noexcept;

// VMMIPC_EXPORT_IN_GET (the default), from get: exports the chunk at
// `address` on the calling thread before its handle leaves the process, so
// that no export runs while peers import (an export beside a peer's imports
// made them 2-3x slower, measured). Best effort: a failed export is said at
// debug level and done again when the chunk is first requested.
void ExportInGet(uint64_t address) noexcept;

// VMMIPC_BACKGROUND_EXPORT, from the cuMemMap hook: queues the chunk just
// recorded for the background export when get could share it (exportable as
// a POSIX fd, mapped from offset 0). Starts the export thread on the first
// call. Best effort: a chunk not queued is exported at its get.
void ExportInBackground(ExportSide& exporter, const ledger::VmmMapping& mapping) noexcept;

// The background export, when on (else null), for a BusyScope around work it
// must not run beside: an open, a request served, a get's export.
BackgroundExport* BackgroundIfOn();

// How many fds the exported-fd cache may hold before the background export
// leaves chunks to their get: half the cache's bound (`cache_limit`), so that
// exports no one asked for never evict the fds of chunks that were asked for,
// and no more than `cached` plus a quarter of the process's `free_fds` (the
// soft RLIMIT_NOFILE less the fds open), so that the host keeps most of what
// it has free.
size_t BackgroundExportCap(size_t cache_limit, size_t cached, size_t free_fds);

}  // namespace vmmipc::core
