// ArenaSide: the export arena's state: one fixed-address reservation, made on
// first use, and the carves of it handed out as this process's own
// reservations (core/arena/export_arena.h has the hooks and why).
//
// Locking: arena_mutex_ guards every member; each method holds it for its
// whole call, including the arena's one reservation on first use (a driver
// call under the lock, once, so that concurrent first reservations agree).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "ledger/arena_carver.h"

namespace vmmipc::core {

struct ArenaCarveInfo {
  uint64_t arena_base = 0;
  uint64_t base = 0;  // the carved reservation holding the address
  uint64_t size = 0;
};

class ArenaSide {
 public:
  struct Region {
    uint64_t base = 0;
    uint64_t size = 0;
  };
  // Reserves the arena; nullopt when it cannot (the arena is then off).
  using Reserve = std::optional<Region> (*)();

  // Carves `size` bytes aligned to `alignment` (a power of two), reserving
  // the arena with `reserve()` on the first call. nullopt when the arena is
  // off or full (the first time it is full, one warning).
  std::optional<uint64_t> Take(uint64_t size, uint64_t alignment, Reserve reserve);

  enum class Freed {
    kNotInArena,  // the driver's reservation, not the arena's
    kFreed,       // exactly one carve, returned to the arena
    kNotACarve,   // inside the arena but not exactly one carve
  };
  Freed Give(uint64_t pointer, uint64_t size);

  // True when `address` lies in a carve of the arena.
  bool Find(uint64_t address, ArenaCarveInfo* info);

 private:
  enum class State { kUntried, kReserved, kUnavailable };

  std::mutex arena_mutex_;
  State state_ = State::kUntried;
  uint64_t base_ = 0;
  std::unique_ptr<ledger::ArenaCarver> carver_;
  bool exhausted_warned_ = false;
};

// This process's export arena (the export side's); makes the process state
// (core/process_state.cc) on the first call.
ArenaSide& Arena();

}  // namespace vmmipc::core
