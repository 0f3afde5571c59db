// An exported POSIX fd for one of the process's own tracked VMM chunks,
// through the exported-fd cache: N importers of a chunk cost one export; the
// cache's bound; the context listener threads export in.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "common/scoped_fd.h"
#include "core/process_state.h"
#include "state/vmm_mappings.h"

namespace vmmipc::core {

// A dup of the chunk's cached exported fd (no driver call), else a fresh
// export that is cached for the next grant. Racing callers export once.
CUresult FdForChunk(ProcessState& state, const state::VmmMapping& chunk, ScopedFd* fd);

// The exported-fd cache's bound: `configured` (VMMIPC_EXPORT_FD_CACHE), but
// never more than a quarter of the fds the process may open.
size_t FdCacheLimit(int64_t configured);

// For a listener thread about to export or describe chunks: makes the context
// of the first export current on it, once per thread.
void UseExportContext(const ProcessState& state);

}  // namespace vmmipc::core
