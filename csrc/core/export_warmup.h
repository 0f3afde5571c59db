// After the process's first export, what keeps its later exports cheap: the
// export anchor (VMMIPC_EXPORT_ANCHOR: one exported fd of a small allocation
// of its own, kept until exit, so that the driver's per-process export state
// outlives the unmap of every exported chunk) and an fd table sized once for
// the exported-fd cache (common/fd_table.h).
#pragma once

#include <cstdint>

#include "core/process_state.h"

namespace vmmipc::core {

// Called after an export of a chunk on `device` succeeded: the first call of
// the process posts the warm-up to a listener worker (off the answer's path);
// every later call returns at once.
void WarmUpAfterFirstExport(ProcessState& state, int32_t device) noexcept;

}  // namespace vmmipc::core
