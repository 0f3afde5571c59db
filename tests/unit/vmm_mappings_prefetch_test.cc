// The mapping table's part in prefetch: which runs one reply may send an
// importer that did not present their handles (ledger/vmm_mappings.h,
// TakePrefetch), and that each is then recorded as that importer's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <vector>

#include "ledger/vmm_mappings.h"

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A chunk of `size` at `base` in a region [region, region_end), on device 0.
VmmMapping Chunk(uint64_t base, uint64_t size, uint64_t region, uint64_t region_end) {
  VmmMapping m;
  m.base = base;
  m.size = size;
  m.posix_fd_exportable = true;
  m.device = 0;
  m.region_base = region;
  m.region_end = region_end;
  return m;
}

// Adds `m`, caches an exported fd for it, and hands out a handle of it.
uint32_t AddExportedHandedOut(VmmMappings* table, const VmmMapping& m, bool handed_out = true) {
  const uint32_t gen = table->Add(m);
  std::vector<ScopedFd> evicted;
  table->CacheFd(m.base, gen, ScopedFd(memfd_create("exported", MFD_CLOEXEC)), &evicted);
  if (handed_out) table->MarkHandedOut(m.base, gen);
  return gen;
}

PrefetchAsk Ask(uint32_t follower, size_t max_chunks = 64, uint64_t max_bytes = 1ull << 40) {
  PrefetchAsk ask;
  ask.follower = follower;
  ask.device = 0;
  ask.max_chunks = max_chunks;
  ask.max_bytes = max_bytes;
  return ask;
}

TEST(VmmMappingsPrefetch, HandedOutCompleteRunsGoOnceToEachFollower) {
  VmmMappings table;
  // A: one chunk filling its region; B: two chunks filling theirs, the
  // handle at the first; C: exported but never handed out.
  AddExportedHandedOut(&table, Chunk(100 * kMiB, 2 * kMiB, 100 * kMiB, 102 * kMiB));
  AddExportedHandedOut(&table, Chunk(200 * kMiB, 2 * kMiB, 200 * kMiB, 204 * kMiB));
  AddExportedHandedOut(&table, Chunk(202 * kMiB, 2 * kMiB, 200 * kMiB, 204 * kMiB), false);
  AddExportedHandedOut(&table, Chunk(300 * kMiB, 2 * kMiB, 300 * kMiB, 302 * kMiB), false);
  std::vector<PrefetchRun> runs = table.TakePrefetch(Ask(7));
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].chunks.size(), 1u);
  EXPECT_EQ(runs[0].chunks[0].base, 100 * kMiB);
  ASSERT_EQ(runs[1].chunks.size(), 2u);
  EXPECT_EQ(runs[1].chunks[1].base, 202 * kMiB);
  for (const PrefetchRun& run : runs)
    for (const ScopedFd& fd : run.fds) {
      EXPECT_TRUE(fd.valid());
      EXPECT_TRUE(fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
    }
  // Recorded as follower 7's: not again to it, but to another follower.
  EXPECT_TRUE(table.TakePrefetch(Ask(7)).empty());
  EXPECT_EQ(table.TakePrefetch(Ask(8)).size(), 2u);
  // And an unmap tells it.
  const TakenMappings taken = table.Take(100 * kMiB, 2 * kMiB);
  ASSERT_EQ(taken.holders.size(), 1u);
  EXPECT_EQ(taken.holders[0], (std::vector<uint32_t>{7, 8}));
}

TEST(VmmMappingsPrefetch, RunsThatCouldGrowOrAreNotExportedOrHeldOrElsewhereAreNotSent) {
  VmmMappings table;
  // Stops short of its region's end: a later map could extend it.
  AddExportedHandedOut(&table, Chunk(100 * kMiB, 2 * kMiB, 100 * kMiB, 110 * kMiB));
  // Not exported yet (no cached fd).
  const uint32_t gen = table.Add(Chunk(200 * kMiB, 2 * kMiB, 200 * kMiB, 202 * kMiB));
  table.MarkHandedOut(200 * kMiB, gen);
  // On another device.
  VmmMapping other = Chunk(300 * kMiB, 2 * kMiB, 300 * kMiB, 302 * kMiB);
  other.device = 1;
  AddExportedHandedOut(&table, other);
  // The handle's own run (skipped), and one the follower already holds.
  AddExportedHandedOut(&table, Chunk(400 * kMiB, 2 * kMiB, 400 * kMiB, 402 * kMiB));
  const uint32_t held =
      AddExportedHandedOut(&table, Chunk(500 * kMiB, 2 * kMiB, 500 * kMiB, 502 * kMiB));
  table.AddHolder(500 * kMiB, held, 7);
  PrefetchAsk ask = Ask(7);
  ask.skip_base = 400 * kMiB;
  ask.skip_end = 402 * kMiB;
  EXPECT_TRUE(table.TakePrefetch(ask).empty());
  // Re-created memory is not the memory a handle was handed out for.
  AddExportedHandedOut(&table, Chunk(600 * kMiB, 2 * kMiB, 600 * kMiB, 602 * kMiB));
  AddExportedHandedOut(&table, Chunk(600 * kMiB, 2 * kMiB, 600 * kMiB, 602 * kMiB), false);
  EXPECT_TRUE(table.TakePrefetch(ask).empty());
  EXPECT_TRUE(table.TakePrefetch(Ask(0)).empty()) << "follower 0 is nobody to tell of an unmap";
}

TEST(VmmMappingsPrefetch, WholeRunsUpToTheBoundsOnly) {
  VmmMappings table;
  for (uint64_t i = 0; i < 10; ++i)
    AddExportedHandedOut(
        &table, Chunk((100 + 2 * i) * kMiB, 2 * kMiB, (100 + 2 * i) * kMiB, (102 + 2 * i) * kMiB));
  // And a run of three chunks: runs are sent whole or not at all.
  AddExportedHandedOut(&table, Chunk(200 * kMiB, 2 * kMiB, 200 * kMiB, 206 * kMiB));
  AddExportedHandedOut(&table, Chunk(202 * kMiB, 2 * kMiB, 200 * kMiB, 206 * kMiB), false);
  AddExportedHandedOut(&table, Chunk(204 * kMiB, 2 * kMiB, 200 * kMiB, 206 * kMiB), false);
  std::vector<PrefetchRun> runs = table.TakePrefetch(Ask(7, 4));
  EXPECT_EQ(runs.size(), 4u);
  size_t chunks = 0;
  for (const PrefetchRun& run : runs) chunks += run.chunks.size();
  EXPECT_EQ(chunks, 4u);
  // Bytes: 3 chunks' worth lets only whole runs that fit through.
  runs = table.TakePrefetch(Ask(8, 64, 5 * kMiB));
  chunks = 0;
  for (const PrefetchRun& run : runs) chunks += run.chunks.size();
  EXPECT_EQ(chunks, 2u);
  // Unbounded: the rest, the three-chunk run whole.
  runs = table.TakePrefetch(Ask(7));
  ASSERT_EQ(runs.size(), 7u);
  EXPECT_EQ(runs.back().chunks.size(), 3u);
}

}  // namespace
}  // namespace vmmipc::ledger
