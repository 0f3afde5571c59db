// ZoneAnchorTable: the import zone's page-table anchors, bookkeeping only.
//
// The driver frees a GPU's page table of a 512 MiB stretch of address space
// with the last mapping in it, and the next cuMemSetAccess there builds it
// again (docs/driver-behaviour.md#page-tables), the table above (256 GiB)
// too, which the stretch's mapping keeps as well; a mapping
// of anything elsewhere in the same 512 MiB keeps them. Imported chunks land
// in the zone at their exporter's offsets, often alone in their 512 MiB, so
// every open after the last close of a stretch paid that. An anchor is one
// small mapping of the importer's own memory that core leaves in a stretch a
// close emptied, placed where no imported chunk lies; an open that needs its
// spot moves it.
// Keyed by stretch and rank slot: a stretch is anchored within one slot's
// range only, so the slot's placement lock covers everything done to it.
// Not thread-safe: core locks (ImportSide).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "ledger/import_table.h"
#include "ledger/import_zone.h"

namespace vmmipc::ledger {

// The stretch whose page table one anchor keeps: 256 entries of 2 MiB, the
// GPU MMU's lowest directory for 2 MiB pages (measured on an H200: a mapping
// 254 MiB above a chunk at offset 256 MiB of a stretch keeps it, one 258 MiB
// above does not).
inline constexpr uint64_t kAnchorStretch = 512ull << 20;

struct AnchorKey {
  uint64_t stretch = 0;  // kAnchorStretch-aligned address
  uint32_t slot = 0;     // the zone's rank slot
  auto operator<=>(const AnchorKey&) const = default;
};

struct Anchor {
  uint64_t address = 0;
  uint64_t size = 0;
  int32_t device = -1;  // whose page tables it keeps (its access)
};

// An address range [begin, end).
struct Span {
  uint64_t begin = 0;
  uint64_t end = 0;
};

class ZoneAnchorTable {
 public:
  std::optional<Anchor> Find(const AnchorKey& key) const;
  void Set(const AnchorKey& key, const Anchor& anchor);
  void Clear(const AnchorKey& key);
  size_t count() const { return anchors_.size(); }

 private:
  std::map<AnchorKey, Anchor> anchors_;
};

// The stretches that [begin, end) touches, ascending (empty when begin >= end).
std::vector<uint64_t> StretchesOf(uint64_t begin, uint64_t end);

// The highest `size`-aligned spot of `size` bytes in `within` that overlaps
// none of `busy`; nullopt when there is none.
std::optional<uint64_t> FreeSpot(const Span& within, uint64_t size, std::vector<Span> busy);

// The part of stretch `stretch` that lies in `slot_span`.
Span StretchInSlot(uint64_t stretch, const Span& slot_span);

// The zone's range of slot `slot`.
Span SlotSpan(const ZoneLayout& zone, uint32_t slot);

// The anchor keys of the stretches that `chunks` touch inside slot `slot`.
std::set<AnchorKey> AnchorKeysOf(const ZoneLayout& zone, uint32_t slot,
                                 const std::vector<MappedChunk>& chunks);

// The ranges `chunks` cover.
std::vector<Span> SpansOf(const std::vector<MappedChunk>& chunks);

}  // namespace vmmipc::ledger
