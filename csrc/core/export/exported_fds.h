// An exported POSIX fd for one of the process's own tracked VMM chunks,
// through the exported-fd cache: N importers of a chunk cost one export; the
// context listener threads export in.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "common/scoped_fd.h"
#include "core/export/export_side.h"
#include "ledger/vmm_mappings.h"

namespace vmmipc::core {

// A dup of the chunk's cached exported fd (no driver call), else a fresh
// export that is cached for the next grant. Racing callers export once.
CUresult FdForChunk(ExportSide& exporter, const ledger::VmmMapping& chunk, ScopedFd* fd);

// For a listener thread about to export or describe chunks: makes the context
// of the first export current on it, once per thread.
void UseExportContext(const ExportSide& exporter);

}  // namespace vmmipc::core
