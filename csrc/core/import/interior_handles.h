// What an open returns for a handle taken inside a chunk
// (VMMIPC_INTERIOR_HANDLES): the importer's address of exactly the handle's
// address, or of the start of its chunk, as the driver's legacy handles do.
// docs/driver-behaviour.md, "Interior handles", has the driver's rule as
// measured and the callers of each kind.
#pragma once

#include <cstdint>

#include "ledger/handle_codec.h"

namespace vmmipc::core {

// The exporter address whose importer address the open of `handle` returns:
// the handle's own address, or its chunk's base. A handle taken at a chunk's
// start gets its address under every setting.
uint64_t OpenedExporterAddress(const ledger::Vmm2Handle& handle);

}  // namespace vmmipc::core
