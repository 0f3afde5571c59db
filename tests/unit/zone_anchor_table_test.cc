// The page-table anchors' bookkeeping: which stretches a range touches, the
// part of a stretch inside a slot, where a free spot is, and the import
// table's view of a stretch.
#include "ledger/zone_anchor_table.h"

#include <gtest/gtest.h>

#include "ledger/import_table.h"

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kStretch = 512ull << 20;  // kAnchorStretch
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kZone = 0x300000000000ull;

TEST(ZoneAnchorTable, StretchesOfARangeAreThe512MiBsItTouches) {
  EXPECT_EQ(kAnchorStretch, kStretch);
  EXPECT_TRUE(StretchesOf(kZone, kZone).empty());
  EXPECT_EQ(StretchesOf(kZone, kZone + 2 * kMiB), std::vector<uint64_t>{kZone});
  EXPECT_EQ(StretchesOf(kZone + kStretch - 2 * kMiB, kZone + kStretch + 2 * kMiB),
            (std::vector<uint64_t>{kZone, kZone + kStretch}));
  EXPECT_EQ(StretchesOf(kZone + 5 * kMiB, kZone + 3 * kGiB).size(), 6u);
  // The top of the address space does not wrap.
  EXPECT_EQ(StretchesOf(UINT64_MAX - kMiB, UINT64_MAX).size(), 1u);
}

TEST(ZoneAnchorTable, AStretchIsCutToItsSlot) {
  const Span slot{kZone + 8 * kMiB, kZone + 16 * kMiB};
  const Span part = StretchInSlot(kZone, slot);
  EXPECT_EQ(part.begin, slot.begin);
  EXPECT_EQ(part.end, slot.end);
  const Span whole = StretchInSlot(kZone + kGiB, {kZone, kZone + 4 * kGiB});
  EXPECT_EQ(whole.begin, kZone + kGiB);
  EXPECT_EQ(whole.end, kZone + kGiB + kStretch);
  const Span none = StretchInSlot(kZone + 2 * kGiB, slot);  // outside the slot: empty
  EXPECT_EQ(none.begin, none.end);
}

TEST(ZoneAnchorTable, FreeSpotIsTheHighestAlignedGapOrNone) {
  const Span stretch{kZone, kZone + kStretch};
  EXPECT_EQ(FreeSpot(stretch, 2 * kMiB, {}), kZone + kStretch - 2 * kMiB);
  // The top is taken: just below it.
  EXPECT_EQ(FreeSpot(stretch, 2 * kMiB, {{kZone + kStretch - 6 * kMiB, kZone + kStretch}}),
            kZone + kStretch - 8 * kMiB);
  // An unaligned busy range pushes the spot to the aligned address below it.
  EXPECT_EQ(FreeSpot(stretch, 2 * kMiB, {{kZone + kStretch - 3 * kMiB, kZone + kStretch}}),
            kZone + kStretch - 6 * kMiB);
  // Several busy ranges, in any order: the gap between them.
  EXPECT_EQ(FreeSpot({kZone, kZone + 8 * kMiB}, 2 * kMiB,
                     {{kZone + 6 * kMiB, kZone + 8 * kMiB},
                      {kZone, kZone + 2 * kMiB},
                      {kZone + 4 * kMiB, kZone + 6 * kMiB}}),
            kZone + 2 * kMiB);
  // Full, too small, not a power of two, or empty: none.
  EXPECT_FALSE(FreeSpot({kZone, kZone + 4 * kMiB}, 2 * kMiB, {{kZone, kZone + 4 * kMiB}}));
  EXPECT_FALSE(FreeSpot({kZone, kZone + kMiB}, 2 * kMiB, {}));
  EXPECT_FALSE(FreeSpot(stretch, 3 * kMiB, {}));
  EXPECT_FALSE(FreeSpot(stretch, 0, {}));
  EXPECT_FALSE(FreeSpot({kZone, kZone}, 2 * kMiB, {}));
  // A busy range at address 0 never underflows.
  EXPECT_FALSE(FreeSpot({0, 2 * kMiB}, 2 * kMiB, {{0, kMiB}}));
}

TEST(ZoneAnchorTable, TableKeysAnchorsByStretchAndSlot) {
  ZoneAnchorTable anchors;
  EXPECT_FALSE(anchors.Find({kZone, 0}));
  anchors.Set({kZone, 0}, {kZone + kGiB - 2 * kMiB, 2 * kMiB, 0});
  anchors.Set({kZone, 1}, {kZone + 10 * kMiB, 2 * kMiB, 1});
  EXPECT_EQ(anchors.count(), 2u);
  EXPECT_EQ(anchors.Find({kZone, 0})->address, kZone + kGiB - 2 * kMiB);
  EXPECT_EQ(anchors.Find({kZone, 1})->device, 1);
  anchors.Set({kZone, 0}, {kZone, 2 * kMiB, 0});  // moved
  EXPECT_EQ(anchors.Find({kZone, 0})->address, kZone);
  anchors.Clear({kZone, 0});
  EXPECT_FALSE(anchors.Find({kZone, 0}));
  EXPECT_EQ(anchors.count(), 1u);
}

TEST(ZoneAnchorTable, KeysAreTheStretchesChunksTouchWithinTheirSlot) {
  // Slots of 8 MiB: a chunk running past its slot counts only inside it.
  const ZoneLayout zone{kZone, 4, 8 * kMiB};
  const ExporterId e{7, 1};
  const std::vector<MappedChunk> chunks = {{kZone + 8 * kMiB, 2 * kMiB, e, 0, 1, 0, 0},
                                           {kZone + 14 * kMiB, 4 * kMiB, e, 0, 1, 0, 0}};
  const std::set<AnchorKey> keys = AnchorKeysOf(zone, 1, chunks);
  EXPECT_EQ(keys, (std::set<AnchorKey>{{kZone, 1}}));  // all of slot 1 lies in one stretch
  const Span slot = SlotSpan(zone, 1);
  EXPECT_EQ(slot.begin, kZone + 8 * kMiB);
  EXPECT_EQ(slot.end, kZone + 16 * kMiB);
  // Slots of 1 GiB: a chunk across a 512 MiB boundary touches two stretches.
  const ZoneLayout big{kZone, 4, kGiB};
  EXPECT_EQ(AnchorKeysOf(big, 0, {{kZone + kStretch - 2 * kMiB, 4 * kMiB, e, 0, 1, 0, 0}}),
            (std::set<AnchorKey>{{kZone, 0}, {kZone + kStretch, 0}}));
  const std::vector<Span> spans = SpansOf(chunks);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1].begin, kZone + 14 * kMiB);
  EXPECT_EQ(spans[1].end, kZone + 18 * kMiB);
}

TEST(ZoneAnchorTable, ImportTableListsTheChunksOverlappingARange) {
  ImportTable table;
  const ExporterId e{7, 1};
  for (uint64_t offset : {uint64_t{0}, 4 * kMiB, 10 * kMiB})
    table.AddChunk({kZone + offset, 2 * kMiB, e, offset, 1, 0, 0});
  EXPECT_EQ(table.ChunksIn(kZone, kZone + kGiB).size(), 3u);
  // The chunk that starts before the range but reaches into it counts.
  std::vector<MappedChunk> in = table.ChunksIn(kZone + kMiB, kZone + 5 * kMiB);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].target, kZone);
  EXPECT_EQ(in[1].target, kZone + 4 * kMiB);
  EXPECT_TRUE(table.ChunksIn(kZone + 6 * kMiB, kZone + 10 * kMiB).empty());
  EXPECT_TRUE(table.ChunksIn(kZone + 12 * kMiB, kZone + kGiB).empty());
}

}  // namespace
}  // namespace vmmipc::ledger
