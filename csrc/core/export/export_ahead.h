// Export ahead: chunks queued for export into the exported-fd cache before
// their first request, drained by one listener task at a time.
#pragma once

#include <cstdint>

#include "core/export/export_side.h"

namespace vmmipc::core {

// Called by get for a chunk whose fd is not cached yet: queues it for a
// listener worker. Get itself only pushes an address (and posts one task per
// batch). Best effort: a chunk not queued is exported when first requested.
void QueueExportAhead(ExportSide& exporter, uint64_t address) noexcept;

// VMMIPC_EXPORT_ON_MAP, from the cuMemMap hook: queues the chunk mapped at
// `base` when this process has shared VMM memory before (its listener runs),
// so that its export is done long before the handles are exchanged.
void ExportAheadOfMap(ExportSide& exporter, uint64_t base) noexcept;

}  // namespace vmmipc::core
