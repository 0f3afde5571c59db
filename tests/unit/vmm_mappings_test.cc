// The mapping table behind get's driver-free fast path: lookups, overlaps,
// removal by range, and a new generation for every new mapping.
#include "state/vmm_mappings.h"

#include <gtest/gtest.h>

namespace vmmipc::state {
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
}  // namespace vmmipc::state
