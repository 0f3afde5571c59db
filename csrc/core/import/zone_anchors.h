// The import zone's page-table anchors (ledger/zone_anchor_table.h says why): the
// driver calls that leave, move and drop them around the closes' unmaps and
// the opens' maps. An anchor only saves time: every failure here is logged
// and skipped, and is never an open's or a close's error.
#pragma once

#include <cstdint>
#include <vector>

#include "core/import/import_side.h"
#include "ledger/import_table.h"

namespace vmmipc::core {

// Before a close unmaps `chunks` (already out of the import table), under
// their slot's placement lock: anchors each stretch of the zone that they
// leave without a mapped chunk (VMMIPC_ZONE_ANCHORS).
void AnchorBeforeUnmap(ImportSide& importer, const std::vector<ledger::MappedChunk>& chunks);

// Before an open maps `chunks` in zone slot `slot`, under its placement lock:
// moves every anchor of the slot that lies where one of them goes (or drops
// it when its stretch has no other free spot). False, logged, when such an
// anchor could not be unmapped: the open's map would fail over it.
bool ClearAnchorsFor(ImportSide& importer, uint32_t slot,
                     const std::vector<ledger::MappedChunk>& chunks);

}  // namespace vmmipc::core
