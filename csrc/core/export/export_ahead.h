// Export ahead: chunks exported into the exported-fd cache before their first
// request, by get itself (VMMIPC_EXPORT_IN_GET) or queued and drained by one
// listener task at a time.
#pragma once

#include <cstdint>

#include "core/export/export_side.h"

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

// VMMIPC_EXPORT_ON_MAP, from the cuMemMap hook: queues the chunk mapped at
// `base` when this process has shared VMM memory before (its listener runs),
// so that its export is done long before the handles are exchanged.
void ExportAheadOfMap(ExportSide& exporter, uint64_t base) noexcept;

}  // namespace vmmipc::core
