// The anchors' table and the arithmetic of where one may go.
#include "ledger/zone_anchor_table.h"

#include <algorithm>

namespace vmmipc::ledger {

std::optional<Anchor> ZoneAnchorTable::Find(const AnchorKey& key) const {
  auto it = anchors_.find(key);
  if (it == anchors_.end()) return std::nullopt;
  return it->second;
}

void ZoneAnchorTable::Set(const AnchorKey& key, const Anchor& anchor) { anchors_[key] = anchor; }

void ZoneAnchorTable::Clear(const AnchorKey& key) { anchors_.erase(key); }

std::vector<uint64_t> StretchesOf(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> stretches;
  if (begin >= end) return stretches;
  for (uint64_t s = begin & ~(kAnchorStretch - 1); s < end; s += kAnchorStretch) {
    stretches.push_back(s);
    if (s > UINT64_MAX - kAnchorStretch) break;  // the last stretch of the address space
  }
  return stretches;
}

Span StretchInSlot(uint64_t stretch, const Span& slot_span) {
  const uint64_t stretch_end =
      stretch > UINT64_MAX - kAnchorStretch ? UINT64_MAX : stretch + kAnchorStretch;
  Span part{std::max(stretch, slot_span.begin), std::min(stretch_end, slot_span.end)};
  if (part.begin > part.end) part.end = part.begin;
  return part;
}

Span SlotSpan(const ZoneLayout& zone, uint32_t slot) {
  return {zone.SlotBase(slot), zone.SlotBase(slot) + zone.slot_size};
}

std::set<AnchorKey> AnchorKeysOf(const ZoneLayout& zone, uint32_t slot,
                                 const std::vector<MappedChunk>& chunks) {
  std::set<AnchorKey> keys;
  const Span slot_span = SlotSpan(zone, slot);
  for (const MappedChunk& chunk : chunks) {
    const uint64_t begin = std::max(chunk.target, slot_span.begin);
    const uint64_t end = std::min(chunk.target + chunk.size, slot_span.end);
    for (uint64_t stretch : StretchesOf(begin, end)) keys.insert({stretch, slot});
  }
  return keys;
}

std::vector<Span> SpansOf(const std::vector<MappedChunk>& chunks) {
  std::vector<Span> spans;
  spans.reserve(chunks.size());
  for (const MappedChunk& c : chunks) spans.push_back({c.target, c.target + c.size});
  return spans;
}

std::optional<uint64_t> FreeSpot(const Span& within, uint64_t size, std::vector<Span> busy) {
  if (size == 0 || (size & (size - 1)) != 0 || within.end < within.begin ||
      within.end - within.begin < size)
    return std::nullopt;
  // Highest first: an exporter's chunks usually grow upward from its region's
  // base, so the top of a stretch is the spot least likely to be wanted.
  std::sort(busy.begin(), busy.end(), [](const Span& a, const Span& b) { return a.end > b.end; });
  uint64_t spot = (within.end - size) & ~(size - 1);
  while (spot >= within.begin) {
    bool moved = false;
    for (const Span& b : busy) {
      if (b.begin < spot + size && spot < b.end) {  // overlaps: go below it
        if (b.begin < within.begin + size) return std::nullopt;
        spot = (b.begin - size) & ~(size - 1);
        moved = true;
        break;
      }
    }
    if (!moved) return spot;
  }
  return std::nullopt;
}

}  // namespace vmmipc::ledger
