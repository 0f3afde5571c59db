// The mapping table behind get's driver-free fast path: lookups, overlaps,
// removal by range, a new generation for every new mapping, and the
// exported-fd cache (one export per chunk, a dup per grant, closed with the
// mapping, bounded, emptied in a forked child).
#include "ledger/vmm_mappings.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdint>
#include <vector>

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

VmmMapping At(uint64_t base, uint64_t size) {
  VmmMapping m;
  m.base = base;
  m.size = size;
  m.posix_fd_exportable = true;
  return m;
}

TEST(VmmMappings, FindsTheMappingHoldingAnAddress) {
  VmmMappings table;
  table.Add(At(100 * kMiB, 2 * kMiB));
  table.Add(At(102 * kMiB, 2 * kMiB));
  ASSERT_TRUE(table.Find(103 * kMiB));
  EXPECT_EQ(table.Find(103 * kMiB)->base, 102 * kMiB);
  EXPECT_EQ(table.Find(100 * kMiB)->base, 100 * kMiB);
  EXPECT_FALSE(table.Find(104 * kMiB));
  EXPECT_FALSE(table.Find(99 * kMiB));
}

TEST(VmmMappings, EveryNewMappingHasANewGeneration) {
  VmmMappings table;
  uint32_t first = table.Add(At(100 * kMiB, 2 * kMiB));
  table.Remove(100 * kMiB, 2 * kMiB);
  uint32_t second = table.Add(At(100 * kMiB, 2 * kMiB));
  EXPECT_NE(first, second);
  EXPECT_NE(second, 0u);
  EXPECT_EQ(table.Find(101 * kMiB)->generation, second);
}

TEST(VmmMappings, RemoveTakesEveryOverlappingMapping) {
  VmmMappings table;
  for (uint64_t i = 0; i < 4; ++i) table.Add(At((100 + 2 * i) * kMiB, 2 * kMiB));
  table.Remove(102 * kMiB, 4 * kMiB);  // the second and third
  EXPECT_TRUE(table.Find(100 * kMiB));
  EXPECT_FALSE(table.Find(102 * kMiB));
  EXPECT_FALSE(table.Find(105 * kMiB));
  EXPECT_TRUE(table.Find(106 * kMiB));
  EXPECT_EQ(table.size(), 2u);
}

TEST(VmmMappings, ANewMappingReplacesStaleOverlappingRecords) {
  VmmMappings table;
  table.Add(At(100 * kMiB, 4 * kMiB));
  table.Add(At(102 * kMiB, 2 * kMiB));  // an unmap we never saw, then a new map
  EXPECT_EQ(table.size(), 1u);
  EXPECT_FALSE(table.Find(100 * kMiB));
  EXPECT_EQ(table.Find(103 * kMiB)->base, 102 * kMiB);
}

}  // namespace
}  // namespace vmmipc::ledger

// --- the exported-fd cache ----------------------------------------------------------------------

namespace vmmipc::ledger {
namespace {

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd)
    if (fcntl(fd, F_GETFD) >= 0) ++n;
  return n;
}

ScopedFd Exported() { return ScopedFd(memfd_create("exported", MFD_CLOEXEC)); }

TEST(VmmMappingsFdCache, OneExportServesEveryGrantAsADup) {
  const int baseline = OpenFds();
  {
    VmmMappings table;
    const uint32_t gen = table.Add(At(100 * kMiB, 2 * kMiB));
    EXPECT_FALSE(table.DupCachedFd(100 * kMiB, gen).valid()) << "nothing cached yet";
    std::vector<ScopedFd> evicted;
    ScopedFd first = table.CacheFd(100 * kMiB, gen, Exported(), &evicted);
    ASSERT_TRUE(first.valid());
    EXPECT_EQ(table.cached_fd_count(), 1u);
    ScopedFd second = table.DupCachedFd(100 * kMiB, gen);
    ASSERT_TRUE(second.valid());
    EXPECT_NE(first.get(), second.get());
    EXPECT_NE(fcntl(second.get(), F_GETFD) & FD_CLOEXEC, 0);
    struct stat a {
    }, b{};
    ASSERT_EQ(fstat(first.get(), &a), 0);
    ASSERT_EQ(fstat(second.get(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << "the same exported file";
    // Another generation at the same place is other memory: no fd for it.
    EXPECT_FALSE(table.DupCachedFd(100 * kMiB, gen + 1).valid());
  }
  EXPECT_EQ(OpenFds(), baseline) << "the table closes what it caches";
}

TEST(VmmMappingsFdCache, UnmapTakesTheCachedFdOutForTheCallerToClose) {
  VmmMappings table;
  const uint32_t gen = table.Add(At(100 * kMiB, 2 * kMiB));
  std::vector<ScopedFd> evicted;
  ScopedFd granted = table.CacheFd(100 * kMiB, gen, Exported(), &evicted);
  const int with_cache = OpenFds();
  TakenMappings taken = table.Take(100 * kMiB, 2 * kMiB);
  ASSERT_EQ(taken.records.size(), 1u);
  ASSERT_EQ(taken.fds.size(), 1u);
  EXPECT_EQ(table.cached_fd_count(), 0u);
  EXPECT_FALSE(table.Find(100 * kMiB));
  taken.fds.clear();
  EXPECT_EQ(OpenFds(), with_cache - 1);
  // A failed unmap puts the record back (its fd is gone: the next grant exports again).
  table.Restore(taken.records);
  ASSERT_TRUE(table.Find(100 * kMiB));
  EXPECT_EQ(table.Find(100 * kMiB)->generation, gen);
  EXPECT_FALSE(table.DupCachedFd(100 * kMiB, gen).valid());
}

TEST(VmmMappingsFdCache, CachingForAMappingThatChangedMeanwhileCachesNothing) {
  VmmMappings table;
  const uint32_t old_gen = table.Add(At(100 * kMiB, 2 * kMiB));
  table.Remove(100 * kMiB, 2 * kMiB);
  const uint32_t new_gen = table.Add(At(100 * kMiB, 2 * kMiB));
  std::vector<ScopedFd> evicted;
  ScopedFd fd = Exported();
  const int raw = fd.get();
  ScopedFd back = table.CacheFd(100 * kMiB, old_gen, std::move(fd), &evicted);
  EXPECT_EQ(back.get(), raw) << "handed back uncached";
  EXPECT_EQ(table.cached_fd_count(), 0u);
  EXPECT_FALSE(table.DupCachedFd(100 * kMiB, new_gen).valid());
}

TEST(VmmMappingsFdCache, PastTheLimitTheLeastRecentlyUsedGoesNeverTheLast) {
  VmmMappings table;
  table.SetFdCacheLimit(2);
  uint32_t gen[3];
  for (int i = 0; i < 3; ++i) gen[i] = table.Add(At((100 + 2 * i) * kMiB, 2 * kMiB));
  std::vector<ScopedFd> evicted;
  table.CacheFd(100 * kMiB, gen[0], Exported(), &evicted);
  table.CacheFd(102 * kMiB, gen[1], Exported(), &evicted);
  (void)table.DupCachedFd(100 * kMiB, gen[0]);  // chunk 0 is now the more recent
  table.CacheFd(104 * kMiB, gen[2], Exported(), &evicted);
  EXPECT_EQ(evicted.size(), 1u);
  EXPECT_EQ(table.cached_fd_count(), 2u);
  EXPECT_TRUE(table.DupCachedFd(100 * kMiB, gen[0]).valid());
  EXPECT_FALSE(table.DupCachedFd(102 * kMiB, gen[1]).valid()) << "the least recently used";
  EXPECT_TRUE(table.DupCachedFd(104 * kMiB, gen[2]).valid());
  // A limit of one still keeps one: the process's export state stays warm.
  table.SetFdCacheLimit(1);
  evicted.clear();
  table.Remove(104 * kMiB, 2 * kMiB);
  const uint32_t again = table.Add(At(104 * kMiB, 2 * kMiB));
  table.CacheFd(104 * kMiB, again, Exported(), &evicted);
  EXPECT_EQ(table.cached_fd_count(), 1u);
}

TEST(VmmMappingsFdCache, RunIsOneSnapshotAndStillMappedSeesAnyChange) {
  VmmMappings table;
  for (int i = 0; i < 3; ++i) table.Add(At((100 + 2 * i) * kMiB, 2 * kMiB));
  table.Add(At(120 * kMiB, 2 * kMiB));  // not contiguous: not part of the run
  std::vector<VmmMapping> run = table.Run(100 * kMiB, UINT64_MAX, 100);
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(table.Run(100 * kMiB, 104 * kMiB, 100).size(), 2u) << "stops at the end given";
  EXPECT_EQ(table.Run(100 * kMiB, UINT64_MAX, 2).size(), 2u) << "at most max_chunks";
  EXPECT_TRUE(table.Run(101 * kMiB, UINT64_MAX, 100).empty()) << "starts exactly at a base";
  EXPECT_TRUE(table.StillMapped(run));
  // Chunk 1 freed and re-created at the same address: the run is torn.
  table.Remove(102 * kMiB, 2 * kMiB);
  EXPECT_FALSE(table.StillMapped(run));
  table.Add(At(102 * kMiB, 2 * kMiB));
  EXPECT_FALSE(table.StillMapped(run)) << "a new generation is other memory";
}

TEST(VmmMappingsFdCache, AForkedChildClosesItsCopiesOfTheCache) {
  VmmMappings table;
  const uint32_t gen = table.Add(At(100 * kMiB, 2 * kMiB));
  std::vector<ScopedFd> evicted;
  ScopedFd granted = table.CacheFd(100 * kMiB, gen, Exported(), &evicted);
  const int with_cache = OpenFds();
  ASSERT_TRUE(table.CloseCachedFdsInForkedChild());
  EXPECT_EQ(OpenFds(), with_cache - 1);
  EXPECT_EQ(table.cached_fd_count(), 0u);
  EXPECT_TRUE(table.Find(100 * kMiB)) << "the records stay";
}

}  // namespace
}  // namespace vmmipc::ledger
