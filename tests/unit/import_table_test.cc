// Reference counting of imports: every open matched by one close, shared
// chunks freed by their last user, stale or overlapping chunks detected.
#include "ledger/import_table.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "ledger/chunk_generations.h"

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kChunk = 2 << 20;
const ExporterId kPeer{100, 0xABCDEF};

MappedChunk Chunk(uint64_t target, uint64_t exporter_address, uint32_t generation = 1) {
  return MappedChunk{target, kChunk, kPeer, exporter_address, generation, 0};
}

OpenRecord Open(uint64_t pointer, uint64_t address, std::vector<uint64_t> chunks) {
  OpenRecord r;
  r.pointer = pointer;
  r.key = OpenKey{kPeer, address, 1, 0, 0};
  r.chunks = chunks;
  r.run_base = chunks.front();
  r.run_size = chunks.size() * kChunk;
  return r;
}

TEST(ImportTable, NOpensOfOnePointerNeedNClosesAndTheLastFreesEverything) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  t.AddOpen(Open(0x1000040, 0x7000040, {0x1000000}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.Reopen(OpenKey{kPeer, 0x7000040, 1, 0, 0}), 0x1000040u);
  for (int i = 0; i < 4; ++i) {
    CloseResult r = t.Close(0x1000040);
    EXPECT_TRUE(r.ours);
    EXPECT_FALSE(r.last);
    EXPECT_TRUE(r.to_unmap.empty());
  }
  CloseResult last = t.Close(0x1000040);
  EXPECT_TRUE(last.last);
  ASSERT_EQ(last.to_unmap.size(), 1u);
  EXPECT_EQ(last.to_unmap[0].target, 0x1000000u);
  EXPECT_EQ(t.chunk_count(), 0u);
  EXPECT_EQ(t.open_count(), 0u);
  EXPECT_FALSE(t.Close(0x1000040).ours);  // one close too many: not ours any more
}

TEST(ImportTable, ChunksSharedByTwoOpensAreFreedByTheLastUser) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  t.AddChunk(Chunk(0x1200000, 0x7200000));
  t.AddOpen(Open(0x1000000, 0x7000000, {0x1000000, 0x1200000}));
  t.AddOpen(Open(0x1200100, 0x7200100, {0x1200000}));
  CloseResult first = t.Close(0x1000000);
  ASSERT_EQ(first.to_unmap.size(), 1u);  // chunk 0 only; chunk 1 still used
  EXPECT_EQ(first.to_unmap[0].target, 0x1000000u);
  CloseResult second = t.Close(0x1200100);
  ASSERT_EQ(second.to_unmap.size(), 1u);
  EXPECT_EQ(second.to_unmap[0].target, 0x1200000u);
}

TEST(ImportTable, ProbeTellsSameFreeAndConflict) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000, 5));
  EXPECT_EQ(t.Probe(0x1000000, kChunk, kPeer, 0x7000000, 5), ChunkProbe::kSame);
  EXPECT_EQ(t.Probe(0x1000000, kChunk, kPeer, 0x7000000, 6), ChunkProbe::kConflict);  // stale
  EXPECT_EQ(t.Probe(0x1000000, kChunk, ExporterId{101, 1}, 0x7000000, 5), ChunkProbe::kConflict);
  EXPECT_EQ(t.Probe(0x1000000, kChunk * 2, kPeer, 0x7000000, 5), ChunkProbe::kConflict);
  EXPECT_EQ(t.Probe(0x0F00000, kChunk, kPeer, 0x6F00000, 5), ChunkProbe::kConflict);  // overlaps
  EXPECT_EQ(t.Probe(0x1100000, kChunk, kPeer, 0x7100000, 5), ChunkProbe::kConflict);  // inside
  EXPECT_EQ(t.Probe(0x1200000, kChunk, kPeer, 0x7200000, 5), ChunkProbe::kFree);
  EXPECT_EQ(t.Probe(0x0E00000, kChunk, kPeer, 0x6E00000, 5), ChunkProbe::kFree);
}

TEST(ImportTable, UnusedChunksOfAFailedOpenCanBeTakenBack) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  EXPECT_EQ(t.TakeUnused({0x1000000, 0x5000000}).size(), 1u);
  EXPECT_EQ(t.chunk_count(), 0u);
}

TEST(ImportTable, FindByAddressAnswersForTheRun) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  t.AddChunk(Chunk(0x1200000, 0x7200000));
  t.AddOpen(Open(0x1000010, 0x7000010, {0x1000000, 0x1200000}));
  ASSERT_NE(t.FindByAddress(0x13FFFFF), nullptr);
  EXPECT_EQ(t.FindByAddress(0x13FFFFF)->run_base, 0x1000000u);
  EXPECT_EQ(t.FindByAddress(0x1400000), nullptr);
  EXPECT_EQ(t.FindByAddress(0x0FFFFFF), nullptr);
}

TEST(ImportTable, ASlotServesOneExporterWhileItHasOpensThere) {
  ImportTable t;
  EXPECT_FALSE(t.SlotOwner(3));
  OpenRecord first = Open(0x1000000, 0xA000, {0x1000000});
  first.zone_slot = 3;
  OpenRecord second = Open(0x1200000, 0xA200000, {0x1200000});
  second.zone_slot = 3;
  t.AddChunk(Chunk(0x1000000, 0xA000));
  t.AddChunk(Chunk(0x1200000, 0xA200000));
  t.AddOpen(first);
  t.AddOpen(second);
  ASSERT_TRUE(t.SlotOwner(3));
  EXPECT_EQ(*t.SlotOwner(3), kPeer);
  EXPECT_FALSE(t.SlotOwner(2));
  // The slot stays the exporter's until its last open there is closed.
  EXPECT_TRUE(t.Close(0x1000000).last);
  EXPECT_TRUE(t.SlotOwner(3));
  EXPECT_TRUE(t.Close(0x1200000).last);
  EXPECT_FALSE(t.SlotOwner(3));
  // A best-effort open is in no slot.
  OpenRecord elsewhere = Open(0x7000000, 0xB000, {0x7000000});
  t.AddChunk(Chunk(0x7000000, 0xB000));
  t.AddOpen(elsewhere);
  EXPECT_FALSE(t.SlotOwner(3));
  // One warning per (slot, exporter).
  EXPECT_TRUE(t.FirstCollision(3, {200, 1}));
  EXPECT_FALSE(t.FirstCollision(3, {200, 1}));
  EXPECT_TRUE(t.FirstCollision(4, {200, 1}));
  EXPECT_TRUE(t.FirstCollision(3, {201, 1}));
  // Another process of the same pid (another pid namespace's) warns again.
  EXPECT_TRUE(t.FirstCollision(3, {200, 2}));
}

// Follow takes the placement lock of every slot an exporter's opens were
// placed under (issue 24: it took the first it found, so a close in a second
// slot could race a follow event).
TEST(ImportTable, RankSlotsOfNamesEverySlotOfAnExporterOnce) {
  ImportTable t;
  EXPECT_TRUE(t.RankSlotsOf(kPeer).empty());
  OpenRecord a = Open(0x1000000, 0xA000, {0x1000000});
  a.key.rank_slot = 0;
  OpenRecord b = Open(0x1200000, 0xA200000, {0x1200000});
  b.key.rank_slot = 5;
  OpenRecord c = Open(0x1400000, 0xA400000, {0x1400000});
  c.key.rank_slot = 5;
  for (uint64_t target : {0x1000000, 0x1200000, 0x1400000}) t.AddChunk(Chunk(target, target));
  t.AddOpen(a);
  t.AddOpen(b);
  t.AddOpen(c);
  std::vector<uint32_t> slots = t.RankSlotsOf(kPeer);
  std::sort(slots.begin(), slots.end());
  EXPECT_EQ(slots, (std::vector<uint32_t>{0, 5}));
  EXPECT_TRUE(t.RankSlotsOf(ExporterId{101, 1}).empty());
}

// An exporter that stops following this process: every mapped chunk of it
// is paused at once, none of another exporter's.
TEST(ImportTable, PauseAllPausesEveryMappedChunkOfThatExporterOnly) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0xA000));
  t.AddChunk(Chunk(0x1200000, 0xA200000));
  MappedChunk other = Chunk(0x1400000, 0xA000);
  other.exporter = ExporterId{101, 1};
  t.AddChunk(other);
  EXPECT_EQ(t.Pause(kPeer, 0xA000, 1).size(), 1u);  // one already paused
  EXPECT_EQ(t.PauseAll(kPeer).size(), 1u);
  EXPECT_TRUE(t.PauseAll(kPeer).empty());
  EXPECT_EQ(t.PausedAt(ExporterId{101, 1}, 0xA000).size(), 0u);
}

TEST(ChunkGenerations, RecreatedHandlesGetNewGenerations) {
  ChunkGenerations g;
  uint32_t first = g.OnCreate(0x10);
  EXPECT_EQ(g.GetOrAssign(0x10), first);
  uint32_t second = g.OnCreate(0x10);  // the driver reused the handle value
  EXPECT_NE(first, second);
  g.OnRelease(0x10);
  uint32_t third = g.GetOrAssign(0x10);  // released but still mapped: a stable new one
  EXPECT_NE(third, second);
  EXPECT_EQ(g.GetOrAssign(0x10), third);
  EXPECT_NE(third, 0u);
}

}  // namespace
}  // namespace vmmipc::ledger

namespace vmmipc::ledger {
namespace {

// Ahead: a run mapped ahead of the application (an exporter's announcement)
// is adopted by the application's first open of the same handle on the same
// device, is never the application's to close before that, and goes with
// its exporter's pause or free, or all of them.
OpenRecord Ahead(uint64_t pointer, uint64_t address, std::vector<uint64_t> chunks,
                 int32_t device = 0) {
  OpenRecord r = Open(pointer, address, std::move(chunks));
  r.state = RunState::kMappedAhead;
  r.device = device;
  return r;
}

constexpr RunState kWorker = RunState::kMappedAhead;
constexpr RunState kApplication = RunState::kOpened;

TEST(ImportTableAhead, TheApplicationsOpenAdoptsItAndOneCloseThenUnmaps) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  ASSERT_TRUE(t.AddOpen(Ahead(0x1000000, 0x7000000, {0x1000000})));
  const OpenKey key{kPeer, 0x7000000, 1, 0, 0};
  // Before the application opens it, its pointer is not the application's to close.
  EXPECT_FALSE(t.Close(0x1000000).ours);
  // Another open ahead of the same handle finds it open and bumps nothing.
  Reopener ahead{kWorker, 0};
  EXPECT_EQ(t.Reopen(key, &ahead), 0x1000000u);
  Reopener app{kApplication, 0};
  EXPECT_EQ(t.Reopen(key, &app), 0x1000000u);
  EXPECT_TRUE(app.adopted);
  // A second open of the application is an ordinary reopen.
  Reopener again{kApplication, 0};
  EXPECT_EQ(t.Reopen(key, &again), 0x1000000u);
  EXPECT_FALSE(again.adopted);
  EXPECT_FALSE(t.Close(0x1000000).last);
  const CloseResult last = t.Close(0x1000000);
  EXPECT_TRUE(last.last);
  ASSERT_EQ(last.to_unmap.size(), 1u);
  EXPECT_EQ(t.open_count(), 0u);
  EXPECT_FALSE(t.Close(0x1000000).ours);  // one close too many, as without map ahead
}

TEST(ImportTableAhead, AnOpenOnAnotherDeviceDoesNotAdoptIt) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  ASSERT_TRUE(t.AddOpen(Ahead(0x1000000, 0x7000000, {0x1000000}, /*device=*/1)));
  const OpenKey key{kPeer, 0x7000000, 1, 0, 0};
  Reopener app{kApplication, 0};
  EXPECT_EQ(t.Reopen(key, &app), std::nullopt);
  EXPECT_TRUE(app.in_the_way);
  const CloseResult dropped = t.DropAheadKey(key);
  EXPECT_TRUE(dropped.ours);
  ASSERT_EQ(dropped.to_unmap.size(), 1u);
  EXPECT_EQ(t.open_count(), 0u);
  EXPECT_EQ(t.chunk_count(), 0u);
}

// Issue 43: the application's open decides its interior rule as a fresh open
// would. A run mapped ahead for the exact address of an interior handle,
// adopted by an open whose rule gives the chunk's start (UCX loaded since),
// moves to that open's pointer, and is closed there; one whose new pointer
// another record holds is in the way (dropped, and opened afresh).
TEST(ImportTableAhead, AnAdoptionWithAnotherOpenedAddressMovesTheRecordToItsPointer) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  OpenRecord exact = Ahead(0x1400000, 0x7400000, {0x1000000});
  exact.run_base = 0x1000000;
  exact.opened_address = 0x7400000;  // the handle's own address, 4 MiB into its chunk
  ASSERT_TRUE(t.AddOpen(exact));
  const OpenKey key{kPeer, 0x7400000, 1, 0, 0};
  Reopener app{kApplication, 0, /*opened_address=*/0x7000000};
  EXPECT_EQ(t.Reopen(key, &app), 0x1000000u) << "adopted at the exact address";
  EXPECT_TRUE(app.adopted);
  EXPECT_FALSE(t.Close(0x1400000).ours) << "the old pointer still names the run";
  ASSERT_TRUE(t.KeyOf(0x1000000));
  Reopener again{kApplication, 0, 0x7000000};
  EXPECT_EQ(t.Reopen(key, &again), 0x1000000u);
  EXPECT_FALSE(t.Close(0x1000000).last);
  EXPECT_TRUE(t.Close(0x1000000).last);
  EXPECT_EQ(t.chunk_count(), 0u);

  // The new pointer is another record's: in the way.
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  ASSERT_TRUE(t.AddOpen(Open(0x1000000, 0x7000000, {0x1000000})));
  OpenRecord interior = Ahead(0x1400000, 0x7400000, {0x1000000});
  interior.opened_address = 0x7400000;
  ASSERT_TRUE(t.AddOpen(interior));
  Reopener blocked{kApplication, 0, 0x7000000};
  EXPECT_EQ(t.Reopen(key, &blocked), std::nullopt);
  EXPECT_TRUE(blocked.in_the_way);
  EXPECT_TRUE(t.DropAheadKey(key).ours);
}

// Issue 43: the slot an exporter's first application open placed it in is
// kept whatever comes after; runs mapped ahead establish none.
TEST(ImportTableAhead, TheFirstSlotIsTheApplicationsFirstOpens) {
  ImportTable t;
  EXPECT_EQ(t.FirstSlotOf(kPeer), std::nullopt);
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  OpenRecord ahead = Ahead(0x1000000, 0x7000000, {0x1000000});
  ahead.zone_slot = 0;
  ASSERT_TRUE(t.AddOpen(ahead));
  EXPECT_EQ(t.FirstSlotOf(kPeer), std::nullopt) << "a run mapped ahead established a slot";
  t.AddChunk(Chunk(0x2000000, 0x8000000));
  OpenRecord first = Open(0x2000000, 0x8000000, {0x2000000});
  first.zone_slot = 3;
  ASSERT_TRUE(t.AddOpen(first));
  t.AddChunk(Chunk(0x3000000, 0x9000000));
  OpenRecord later = Open(0x3000000, 0x9000000, {0x3000000});
  later.zone_slot = 5;
  ASSERT_TRUE(t.AddOpen(later));
  EXPECT_TRUE(t.Close(0x2000000).last);
  EXPECT_TRUE(t.Close(0x3000000).last);
  EXPECT_EQ(t.FirstSlotOf(kPeer), 3u) << "kept after every close";
}

TEST(ImportTableAhead, AnOpenAheadJoinsNothingAndTheApplicationJoiningOneAdoptsIt) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  ASSERT_TRUE(t.AddOpen(Open(0x1000000, 0x7000000, {0x1000000})));
  // The same run at the same pointer under another key (a followed resume's
  // handle): an open ahead of it records nothing.
  OpenRecord other = Ahead(0x1000000, 0x7000000, {0x1000000});
  other.key.generation = 2;
  EXPECT_FALSE(t.AddOpen(other));
  EXPECT_TRUE(t.Close(0x1000000).last);

  t.AddChunk(Chunk(0x1000000, 0x7000000));
  ASSERT_TRUE(t.AddOpen(Ahead(0x1000000, 0x7000000, {0x1000000})));
  OpenRecord joining = Open(0x1000000, 0x7000000, {0x1000000});
  joining.key.generation = 2;
  EXPECT_TRUE(t.AddOpen(joining));
  // Adopted: one close of the application's ends it.
  EXPECT_TRUE(t.Close(0x1000000).last);
  EXPECT_EQ(t.open_count(), 0u);
}

TEST(ImportTableAhead, APauseDropsOnlyTheOpensAheadThatHoldItsChunk) {
  ImportTable t;
  t.AddChunk(Chunk(0x1000000, 0x7000000));
  t.AddChunk(Chunk(0x1200000, 0x7200000));
  t.AddChunk(Chunk(0x1400000, 0x7400000));
  ASSERT_TRUE(t.AddOpen(Ahead(0x1000000, 0x7000000, {0x1000000, 0x1200000})));
  ASSERT_TRUE(t.AddOpen(Ahead(0x1400000, 0x7400000, {0x1400000})));
  // The application's open shares the first run's second chunk.
  ASSERT_TRUE(t.AddOpen(Open(0x1200000, 0x7200000, {0x1200000})));
  EXPECT_EQ(t.AheadOf(kPeer).chunks, 3u);
  EXPECT_EQ(t.AheadOf(kPeer).bytes, 3 * kChunk);
  EXPECT_FALSE(t.DropAhead(ExporterId{kPeer.pid, kPeer.instance + 1}, 0, true).ours);
  const CloseResult paused = t.DropAhead(kPeer, 0x7200000, false);
  EXPECT_TRUE(paused.ours);
  // Chunk 1 stays: the application's open holds it.
  ASSERT_EQ(paused.to_unmap.size(), 1u);
  EXPECT_EQ(paused.to_unmap[0].target, 0x1000000u);
  EXPECT_EQ(t.open_count(), 2u);
  const CloseResult all = t.DropAhead(kPeer, 0, true);
  ASSERT_EQ(all.to_unmap.size(), 1u);
  EXPECT_EQ(all.to_unmap[0].target, 0x1400000u);
  EXPECT_EQ(t.AheadOf(kPeer).chunks, 0u);
  EXPECT_TRUE(t.Close(0x1200000).last);
  EXPECT_EQ(t.chunk_count(), 0u);
}

}  // namespace
}  // namespace vmmipc::ledger
