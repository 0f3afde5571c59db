// The mapping table: an ordered map of non-overlapping ranges.
#include "state/vmm_mappings.h"

#include <iterator>
#include <mutex>

namespace vmmipc::state {

void VmmMappings::RemoveLocked(uint64_t base, uint64_t size) {
  auto it = mappings_.lower_bound(base);
  if (it != mappings_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.base + prev->second.size > base) it = prev;
  }
  while (it != mappings_.end() && it->second.base < base + size) it = mappings_.erase(it);
}

uint32_t VmmMappings::Add(VmmMapping mapping) {
  std::unique_lock lock(mutex_);
  RemoveLocked(mapping.base, mapping.size);
  if (++next_generation_ == 0) next_generation_ = 0x80000000u;  // 0 never names memory
  mapping.generation = next_generation_;
  mappings_[mapping.base] = mapping;
  return mapping.generation;
}

void VmmMappings::Remove(uint64_t base, uint64_t size) {
  std::unique_lock lock(mutex_);
  RemoveLocked(base, size);
}

std::optional<VmmMapping> VmmMappings::Find(uint64_t address) const {
  std::shared_lock lock(mutex_);
  auto it = mappings_.upper_bound(address);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (address - it->second.base >= it->second.size) return std::nullopt;
  return it->second;
}

size_t VmmMappings::size() const {
  std::shared_lock lock(mutex_);
  return mappings_.size();
}

}  // namespace vmmipc::state
