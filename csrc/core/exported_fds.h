// An exported POSIX fd for one of the process's own tracked VMM chunks,
// through the exported-fd cache: N importers of a chunk cost one export.
#pragma once

#include <cuda.h>

#include "common/scoped_fd.h"
#include "core/process_state.h"
#include "state/vmm_mappings.h"

namespace vmmipc::core {

// A dup of the chunk's cached exported fd (no driver call), else a fresh
// export that is cached for the next grant. Racing callers export once.
CUresult FdForChunk(ProcessState& state, const state::VmmMapping& chunk, ScopedFd* fd);

}  // namespace vmmipc::core
