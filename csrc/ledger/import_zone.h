// Import-zone arithmetic: where a peer's chunk lands in this process.
// A chunk at exporter address A of exporter rank r lands at
//   zone_base + r * slot_size + (A - region_base)
// when it fits in the slot. Pure arithmetic; core owns the reservation.
#pragma once

#include <cstdint>
#include <optional>

namespace vmmipc::ledger {

struct ZoneLayout {
  uint64_t base = 0;  // 0: no zone (not reserved, or unavailable)
  uint64_t slots = 0;
  uint64_t slot_size = 0;

  // Cannot wrap: config::Parse keeps slots x slot size below kUserAddressEnd.
  uint64_t size() const { return slots * slot_size; }
  bool Contains(uint64_t address) const {
    return base != 0 && address >= base && address - base < size();
  }
  // Where slot `slot` (< slots) begins.
  uint64_t SlotBase(uint32_t slot) const { return base + static_cast<uint64_t>(slot) * slot_size; }
  // The slot that holds `address`; nullopt outside the zone.
  std::optional<uint32_t> SlotAt(uint64_t address) const {
    if (!Contains(address)) return std::nullopt;
    return static_cast<uint32_t>((address - base) / slot_size);
  }
};

// The importer address for [address, address + size) of an exporter with
// `rank_slot` and `region_base`, or nullopt when the rank has no slot or the
// range falls outside the slot (then placement is best-effort).
std::optional<uint64_t> ZoneTarget(const ZoneLayout& zone, uint32_t rank_slot, uint64_t region_base,
                                   uint64_t address, uint64_t size);

}  // namespace vmmipc::ledger
