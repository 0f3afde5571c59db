// Ahead (VMMIPC_AHEAD=1), the exporter's half: a handle its
// application just got is announced to the importers that follow this
// process and asked for announcements (transport/serve/watch/watchers.h,
// Announce: never waits; a full or busy connection misses it).
#pragma once

#include "ledger/handle_codec.h"

namespace vmmipc::core {

class ExportSide;

// After cuIpcGetMemHandle encoded `handle` (`bytes`), on the application's thread.
void AnnounceHandle(ExportSide& exporter, const ledger::Vmm2Handle& handle,
                    const unsigned char bytes[ledger::kHandleSize]);

}  // namespace vmmipc::core
