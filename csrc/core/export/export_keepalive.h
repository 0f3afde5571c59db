// At the process's first export, what keeps its later exports cheap: the
// export keep-alive (VMMIPC_EXPORT_KEEPALIVE: one exported fd of a small allocation
// of its own, kept until exit, so that the driver's per-process export state
// outlives the unmap of every exported chunk). The fd table was sized for the
// exported-fd cache at load time (core/load_time.h).
#pragma once

#include <cstdint>

#include "core/export/export_side.h"

namespace vmmipc::core {

// Called before an export of a chunk on `device`: the first call of the
// process makes the export keep-alive, there and then (the first export pays the
// driver's set-up anyway); a call that comes meanwhile waits for it; later
// calls return at once. Runs on the thread that exports: a listener thread, in the export
// context.
void WarmUpBeforeFirstExport(ExportSide& exporter, int32_t device) noexcept;

}  // namespace vmmipc::core
