// The rank slot a VMM2 handle carries, which decides where importers place
// the memory (ledger/import_zone.h): the process's rank from a variable
// (VMMIPC_RANK, LOCAL_RANK, RANK), else, when VMMIPC_RANK_FROM is auto or
// gpu, the index among the host's GPUs of the GPU that holds the exported
// memory (driver/host_gpus.h), found once per device and logged once; else
// none (ledger::kUnranked), and importers place the memory best-effort.
#pragma once

#include <cstdint>

#include "core/identity.h"

namespace vmmipc::core {

// The slot for memory on `device` (an ordinal of this process; -1: not on a
// device). Cheap after the first call for a device: one atomic load.
uint16_t SlotForExport(Identity& self, int32_t device);

}  // namespace vmmipc::core
