// The importer's prefetched fds (ledger/prefetched_fds.h): kept per
// exporter within bounds, taken whole by the open of a handle in their run,
// dropped one by one or all at once.
#include "ledger/prefetched_fds.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <vector>

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
const ExporterId kExporter{42, 7};
const ExporterId kOther{43, 8};

// A run of `count` chunks of 2 MiB from `base` (region `base`), generation 5.
std::vector<PrefetchedChunk> ChunksFrom(uint64_t base, int count) {
  std::vector<PrefetchedChunk> run;
  for (int i = 0; i < count; ++i)
    run.push_back({base + i * 2 * kMiB, 2 * kMiB, 5, base, base + count * 2 * kMiB,
                   ScopedFd(memfd_create("prefetched", MFD_CLOEXEC))});
  return run;
}

TEST(PrefetchedFds, AnOpenTakesTheRunFromItsChunkToTheRunsEnd) {
  PrefetchedFds fds(16, 1ull << 40);
  auto run = ChunksFrom(100 * kMiB, 3);
  ASSERT_TRUE(fds.Keep(kExporter, &run));
  EXPECT_TRUE(run.empty());
  EXPECT_EQ(fds.fd_count(), 3u);
  // Another exporter's, another generation, size or region: not this run.
  EXPECT_TRUE(fds.TakeRun(kOther, 102 * kMiB, 2 * kMiB, 5, 100 * kMiB).empty());
  EXPECT_TRUE(fds.TakeRun(kExporter, 102 * kMiB, 2 * kMiB, 6, 100 * kMiB).empty());
  EXPECT_TRUE(fds.TakeRun(kExporter, 102 * kMiB, 4 * kMiB, 5, 100 * kMiB).empty());
  EXPECT_TRUE(fds.TakeRun(kExporter, 102 * kMiB, 2 * kMiB, 5, 0).empty());
  EXPECT_EQ(fds.fd_count(), 3u);
  // A handle at the second chunk: the second and third.
  std::vector<PrefetchedChunk> taken = fds.TakeRun(kExporter, 102 * kMiB, 2 * kMiB, 5, 100 * kMiB);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].address, 102 * kMiB);
  EXPECT_EQ(taken[1].address, 104 * kMiB);
  EXPECT_TRUE(taken[0].fd.valid() && taken[1].fd.valid());
  EXPECT_EQ(fds.fd_count(), 1u);
}

TEST(PrefetchedFds, ARunWithAChunkDroppedIsFetchedInstead) {
  PrefetchedFds fds(16, 1ull << 40);
  auto run = ChunksFrom(100 * kMiB, 3);
  ASSERT_TRUE(fds.Keep(kExporter, &run));
  std::vector<PrefetchedChunk> dropped;
  EXPECT_TRUE(fds.Drop(kExporter, 102 * kMiB, &dropped));
  EXPECT_FALSE(fds.Drop(kExporter, 102 * kMiB, &dropped));
  EXPECT_FALSE(fds.Drop(kOther, 100 * kMiB, &dropped));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_TRUE(fds.TakeRun(kExporter, 100 * kMiB, 2 * kMiB, 5, 100 * kMiB).empty());
  EXPECT_EQ(fds.TakeRun(kExporter, 104 * kMiB, 2 * kMiB, 5, 100 * kMiB).size(), 1u);
  EXPECT_EQ(fds.DropExporter(kExporter, &dropped), 1u);
  EXPECT_EQ(fds.fd_count(), 0u);
}

TEST(PrefetchedFds, BoundsPerExporterAndNoOverlap) {
  PrefetchedFds fds(4, 8 * kMiB);
  auto three = ChunksFrom(100 * kMiB, 3);
  ASSERT_TRUE(fds.Keep(kExporter, &three));
  auto two = ChunksFrom(200 * kMiB, 2);
  EXPECT_FALSE(fds.Keep(kExporter, &two)) << "past the fd bound";
  EXPECT_EQ(two.size(), 2u) << "what is not kept stays the caller's";
  auto one = ChunksFrom(200 * kMiB, 1);
  ASSERT_TRUE(fds.Keep(kExporter, &one));
  auto overlapping = ChunksFrom(102 * kMiB, 1);
  EXPECT_TRUE(fds.Keep(kOther, &two)) << "another exporter has bounds of its own";
  EXPECT_FALSE(fds.Keep(kExporter, &overlapping));
  PrefetchedFds small(16, 4 * kMiB);
  auto big = ChunksFrom(100 * kMiB, 3);
  EXPECT_FALSE(small.Keep(kExporter, &big)) << "past the byte bound";
  std::vector<PrefetchedChunk> dropped;
  EXPECT_EQ(fds.DropAll(&dropped), 6u);
  EXPECT_EQ(fds.fd_count(), 0u);
}

// Import ahead: each kept chunk is picked once, with a dup of its fd; an
// import that ends after its chunk went (taken, dropped, or replaced by a
// later one at that address) is not kept, so its caller releases it.
TEST(PrefetchedFds, AnImportThatEndsAfterItsChunkWentIsNotKept) {
  PrefetchedFds fds(16, 1ull << 40);
  auto run = ChunksFrom(100 * kMiB, 1);
  ASSERT_TRUE(fds.Keep(kExporter, &run));
  ExporterId exporter;
  uint64_t address = 0, serial = 0;
  ScopedFd dup;
  ASSERT_TRUE(fds.NextToImport(&exporter, &address, &serial, &dup));
  EXPECT_TRUE(dup.valid());
  EXPECT_EQ(address, 100 * kMiB);
  EXPECT_FALSE(fds.NextToImport(&exporter, &address, &serial, &dup)) << "picked twice";
  // Taken by an open meanwhile, then a new chunk kept at the same address.
  EXPECT_EQ(fds.TakeRun(kExporter, 100 * kMiB, 2 * kMiB, 5, 100 * kMiB).size(), 1u);
  auto again = ChunksFrom(100 * kMiB, 1);
  ASSERT_TRUE(fds.Keep(kExporter, &again));
  EXPECT_FALSE(fds.Imported(kExporter, 100 * kMiB, serial, 77)) << "kept for another chunk";
  // The new one's own import is kept, and goes with it to the open.
  uint64_t serial2 = 0;
  ASSERT_TRUE(fds.NextToImport(&exporter, &address, &serial2, &dup));
  EXPECT_TRUE(fds.Imported(kExporter, 100 * kMiB, serial2, 78));
  std::vector<PrefetchedChunk> taken = fds.TakeRun(kExporter, 100 * kMiB, 2 * kMiB, 5, 100 * kMiB);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].imported, 78u);
}

}  // namespace
}  // namespace vmmipc::ledger
