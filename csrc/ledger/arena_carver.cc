// First-fit carving with coalescing frees.
#include "ledger/arena_carver.h"

#include <iterator>

namespace vmmipc::ledger {

ArenaCarver::ArenaCarver(uint64_t size) : size_(size) {
  if (size > 0) free_[0] = size;
}

std::optional<uint64_t> ArenaCarver::Take(uint64_t size, uint64_t alignment) {
  if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t start = it->first, length = it->second;
    const uint64_t aligned = (start + alignment - 1) & ~(alignment - 1);
    if (aligned < start || aligned - start >= length || length - (aligned - start) < size) continue;
    // Split the free range into [start, aligned), the carve, and the tail.
    const uint64_t tail = length - (aligned - start) - size;
    free_.erase(it);
    if (aligned > start) free_[start] = aligned - start;
    if (tail > 0) free_[aligned + size] = tail;
    carved_[aligned] = size;
    used_ += size;
    return aligned;
  }
  return std::nullopt;
}

bool ArenaCarver::Give(uint64_t offset, uint64_t size) {
  auto carve = carved_.find(offset);
  if (carve == carved_.end() || carve->second != size) return false;
  carved_.erase(carve);
  used_ -= size;
  auto [it, inserted] = free_.emplace(offset, size);
  // Merge with the following and the preceding free ranges.
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
  return true;
}

std::optional<Carve> ArenaCarver::Find(uint64_t offset) const {
  auto it = carved_.upper_bound(offset);
  if (it == carved_.begin()) return std::nullopt;
  --it;
  if (offset - it->first >= it->second) return std::nullopt;
  return Carve{it->first, it->second};
}

}  // namespace vmmipc::ledger
