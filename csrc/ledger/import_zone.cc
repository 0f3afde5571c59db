// Import-zone arithmetic, with every overflow checked: handles come from
// other processes and their fields are not trusted.
#include "ledger/import_zone.h"

namespace vmmipc::ledger {

std::optional<uint64_t> ZoneTarget(const ZoneLayout& zone, uint32_t rank_slot, uint64_t region_base,
                                   uint64_t address, uint64_t size) {
  if (zone.base == 0 || rank_slot >= zone.slots || address < region_base || size == 0)
    return std::nullopt;
  const uint64_t offset = address - region_base;
  if (offset >= zone.slot_size || size > zone.slot_size - offset) return std::nullopt;
  return zone.SlotBase(rank_slot) + offset;
}

}  // namespace vmmipc::ledger
