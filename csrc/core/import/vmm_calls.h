// The importer's VMM driver calls: reserving the import zone (one
// fixed-address reservation of slots x slot size, made on the first import)
// or a private reservation anywhere, mapping an imported chunk, opening its
// access, unmapping it. Where a run goes is decided elsewhere (the place
// step, core/import/open_place.cc).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

#include "core/import/import_side.h"

namespace vmmipc::core {

// The import zone, reserved on first use (ImportSide::Zone); nullopt when it
// could not be (one warning): then every import is placed best-effort.
std::optional<ledger::ZoneLayout> ImportZone(ImportSide& importer);

// A reservation anywhere, for best-effort placement.
CUresult ReserveAnywhere(uint64_t size, uint64_t* base);
void FreeReservation(uint64_t base, uint64_t size);

// Maps one imported chunk (from its fd) at `target`, not yet accessible.
// On failure nothing stays mapped.
CUresult MapChunk(int fd, uint64_t target, uint64_t size);
// Opens [target, target + size), one or more mapped chunks back to back, for
// `device` with one driver call. The driver's cost is per chunk covered all
// the same (docs/driver-behaviour.md#set-access-per-chunk), so one call per
// stretch saves only the calls' own overhead.
CUresult OpenAccess(uint64_t target, uint64_t size, CUdevice device);
void UnmapChunk(uint64_t target, uint64_t size);
// Ahead: unmaps what a drop of runs mapped ahead handed back (a paused
// chunk has nothing mapped) and counts the drop; true when a record went.
// Caller holds the placement locks of what was dropped.
bool UnmapDroppedAhead(const ledger::CloseResult& dropped);

}  // namespace vmmipc::core
