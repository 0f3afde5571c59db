// Import-zone arithmetic, including hostile values from a peer's handle.
#include "ledger/import_zone.h"

#include <gtest/gtest.h>

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kTiB = 1ull << 40;
const ZoneLayout kZone{0x300000000000ull, 8, kTiB};

TEST(ImportZone, SlotTimesStridePlusOffsetFromRegionBase) {
  EXPECT_EQ(ZoneTarget(kZone, 0, 0x7000, 0x7000, 4096), kZone.base);
  EXPECT_EQ(ZoneTarget(kZone, 3, 0x10000000, 0x10200000, 1 << 21),
            kZone.base + 3 * kTiB + 0x200000);
}

TEST(ImportZone, SlotOfAnAddressAndWhereASlotBegins) {
  EXPECT_EQ(kZone.SlotBase(0), kZone.base);
  EXPECT_EQ(kZone.SlotBase(7), kZone.base + 7 * kTiB);
  EXPECT_EQ(kZone.SlotAt(kZone.base), 0u);
  EXPECT_EQ(kZone.SlotAt(kZone.base + 3 * kTiB - 1), 2u);
  EXPECT_EQ(kZone.SlotAt(kZone.base + 3 * kTiB), 3u);
  EXPECT_FALSE(kZone.SlotAt(kZone.base - 1));
  EXPECT_FALSE(kZone.SlotAt(kZone.base + 8 * kTiB));
  EXPECT_FALSE(ZoneLayout{}.SlotAt(0x1000));  // no zone
}

TEST(ImportZone, RangesOutsideTheSlotHaveNoTarget) {
  EXPECT_FALSE(ZoneTarget(kZone, 8, 0, 0, 4096));            // no such slot
  EXPECT_FALSE(ZoneTarget(kZone, 0xFFFF, 0, 0, 4096));       // unranked
  EXPECT_FALSE(ZoneTarget(kZone, 0, 0x2000, 0x1000, 4096));  // below the region
  EXPECT_FALSE(ZoneTarget(kZone, 0, 0, kTiB - 4096, 8192));  // runs past the slot
  EXPECT_FALSE(ZoneTarget(kZone, 0, 0, kTiB, 4096));         // starts past the slot
  EXPECT_FALSE(ZoneTarget(kZone, 0, 0, 0, 0));               // empty
  EXPECT_FALSE(ZoneTarget(kZone, 0, 0, ~0ull - 10, ~0ull));  // wraps
  EXPECT_TRUE(ZoneTarget(kZone, 7, 0, kTiB - 4096, 4096));   // the very last page
  EXPECT_FALSE(ZoneTarget(ZoneLayout{}, 0, 0, 0, 4096));     // no zone
}

TEST(ImportZone, ContainsCoversExactlyTheZone) {
  EXPECT_TRUE(kZone.Contains(kZone.base));
  EXPECT_TRUE(kZone.Contains(kZone.base + 8 * kTiB - 1));
  EXPECT_FALSE(kZone.Contains(kZone.base + 8 * kTiB));
  EXPECT_FALSE(kZone.Contains(kZone.base - 1));
}

}  // namespace
}  // namespace vmmipc::ledger
