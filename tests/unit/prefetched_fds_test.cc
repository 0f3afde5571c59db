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
  std::vector<ScopedFd> dropped;
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
  std::vector<ScopedFd> dropped;
  EXPECT_EQ(fds.DropAll(&dropped), 6u);
  EXPECT_EQ(fds.fd_count(), 0u);
}

}  // namespace
}  // namespace vmmipc::ledger
