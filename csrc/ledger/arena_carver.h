// ArenaCarver: first-fit, alignment-aware carving of one address range into
// reservations, so that the same sequence of reserve and free calls yields
// the same offsets in every run. Pure bookkeeping over offsets; core owns the
// real reservation. Not thread-safe: core locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace vmmipc::ledger {

struct Carve {
  uint64_t offset = 0;
  uint64_t size = 0;
};

class ArenaCarver {
 public:
  explicit ArenaCarver(uint64_t size);

  // The lowest offset that fits `size` bytes aligned to `alignment` (a power
  // of two), or nullopt when nothing fits.
  std::optional<uint64_t> Take(uint64_t size, uint64_t alignment);
  // Returns exactly one earlier carve. False (and no change) when
  // [offset, offset + size) is not a carve.
  bool Give(uint64_t offset, uint64_t size);
  // The carve holding `offset`, if any.
  std::optional<Carve> Find(uint64_t offset) const;

  uint64_t size() const { return size_; }
  uint64_t used() const { return used_; }

 private:
  uint64_t size_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;    // offset -> size, coalesced
  std::map<uint64_t, uint64_t> carved_;  // offset -> size
};

}  // namespace vmmipc::ledger
