// The export anchor: after the process's first export, one exported fd of a
// small allocation of its own, kept until the process exits, so that the
// driver's per-process export state outlives the unmap of every exported
// chunk (VMMIPC_EXPORT_ANCHOR).
#pragma once

#include <cstdint>

#include "core/process_state.h"

namespace vmmipc::core {

// Called after an export of a chunk on `device` succeeded: the first call of
// the process posts the anchor's making to a listener worker (off the answer's
// path); every later call returns at once.
void KeepExportStateAfterFirstExport(ProcessState& state, int32_t device) noexcept;

}  // namespace vmmipc::core
