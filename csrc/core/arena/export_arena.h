// The export arena: every cuMemAddressReserve that asks for no particular
// address is carved from one fixed-address reservation, so a ranked process's
// own VMM addresses (and their offsets from the region base that importers
// mirror) are the same in every run. Small reservations ignore address hints
// in the real driver (measured), so carving, not hinting, is the mechanism.
#pragma once

#include <cstdint>

#include "core/arena/arena_side.h"

namespace vmmipc::core {

// True when `address` lies in a carved reservation of the arena.
bool FindArenaCarve(uint64_t address, ArenaCarveInfo* info);

}  // namespace vmmipc::core
