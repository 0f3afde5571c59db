// First-fit carving: deterministic offsets, alignment, exact frees, coalescing.
#include "ledger/arena_carver.h"

#include <gtest/gtest.h>

#include <vector>

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(ArenaCarver, FirstFitInOrder) {
  ArenaCarver arena(64 * kMiB);
  EXPECT_EQ(arena.Take(4 * kMiB, 2 * kMiB), 0u);
  EXPECT_EQ(arena.Take(2 * kMiB, 2 * kMiB), 4 * kMiB);
  EXPECT_EQ(arena.Take(8 * kMiB, 2 * kMiB), 6 * kMiB);
  EXPECT_EQ(arena.used(), 14 * kMiB);
}

TEST(ArenaCarver, SameSequenceSameOffsets) {
  auto run = [] {
    ArenaCarver arena(256 * kMiB);
    std::vector<uint64_t> seen;
    auto a = arena.Take(20 * kMiB, 2 * kMiB);
    auto b = arena.Take(6 * kMiB, 2 * kMiB);
    arena.Give(*a, 20 * kMiB);
    auto c = arena.Take(10 * kMiB, 8 * kMiB);
    auto d = arena.Take(12 * kMiB, 2 * kMiB);
    for (auto v : {a, b, c, d}) seen.push_back(*v);
    return seen;
  };
  EXPECT_EQ(run(), run());
  EXPECT_EQ(run(), (std::vector<uint64_t>{0, 20 * kMiB, 0, 26 * kMiB}));
}

TEST(ArenaCarver, AlignmentIsHonoured) {
  ArenaCarver arena(1024 * kMiB);
  ASSERT_EQ(arena.Take(2 * kMiB, 2 * kMiB), 0u);
  EXPECT_EQ(arena.Take(2 * kMiB, 512 * kMiB), 512 * kMiB);
  EXPECT_EQ(arena.Take(2 * kMiB, 2 * kMiB), 2 * kMiB);  // the gap before it is reused
  EXPECT_FALSE(arena.Take(2 * kMiB, 3 * kMiB));         // not a power of two
  EXPECT_FALSE(arena.Take(0, 2 * kMiB));
}

TEST(ArenaCarver, ExhaustionAndExactFrees) {
  ArenaCarver arena(8 * kMiB);
  auto a = arena.Take(4 * kMiB, 2 * kMiB);
  auto b = arena.Take(4 * kMiB, 2 * kMiB);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(arena.Take(2 * kMiB, 2 * kMiB));
  EXPECT_FALSE(arena.Give(*a, 2 * kMiB));             // not the carve's size
  EXPECT_FALSE(arena.Give(*a + 2 * kMiB, 2 * kMiB));  // not a carve's start
  EXPECT_TRUE(arena.Give(*a, 4 * kMiB));
  EXPECT_FALSE(arena.Give(*a, 4 * kMiB));  // twice
  EXPECT_TRUE(arena.Give(*b, 4 * kMiB));
  EXPECT_EQ(arena.Take(8 * kMiB, 2 * kMiB), 0u);  // coalesced back to one range
}

TEST(ArenaCarver, FindNamesTheCarveHoldingAnOffset) {
  ArenaCarver arena(64 * kMiB);
  arena.Take(4 * kMiB, 2 * kMiB);
  arena.Take(6 * kMiB, 2 * kMiB);
  auto carve = arena.Find(7 * kMiB);
  ASSERT_TRUE(carve);
  EXPECT_EQ(carve->offset, 4 * kMiB);
  EXPECT_EQ(carve->size, 6 * kMiB);
  EXPECT_FALSE(arena.Find(10 * kMiB));
  EXPECT_FALSE(arena.Find(64 * kMiB));
}

}  // namespace
}  // namespace vmmipc::ledger
