// include/vmmipc/vmmipc.h agrees with the handle codec it summarises.
#include <gtest/gtest.h>

#include <string>

#include "ledger/handle_codec.h"
#include "vmmipc/vmmipc.h"

namespace vmmipc::ledger {
namespace {

TEST(PublicHeader, RecognisesHandlesAndReadsTheRankSlot) {
  Vmm2Handle h;
  h.pid = 7;
  h.capability = 9;
  h.instance = 11;
  h.rank_slot = 5;
  h.chunk_base = h.address = 1 << 21;
  h.chunk_size = 1 << 21;
  unsigned char bytes[kHandleSize];
  EncodeHandle(h, bytes);
  EXPECT_TRUE(vmmipc_looks_like_vmm2_handle(bytes));
  EXPECT_EQ(vmmipc_handle_rank_slot(bytes), 5u);
  EXPECT_EQ(bytes[VMMIPC_HANDLE_VERSION_OFFSET], kHandleVersion);
  EXPECT_EQ(VMMIPC_HANDLE_UNRANKED, kUnranked);
  unsigned char legacy[kHandleSize] = {1, 2, 3};
  EXPECT_FALSE(vmmipc_looks_like_vmm2_handle(legacy));
}

TEST(PublicHeader, VersionMatchesTheProject) {
  EXPECT_EQ(std::to_string(VMMIPC_VERSION_MAJOR) + "." + std::to_string(VMMIPC_VERSION_MINOR) +
                "." + std::to_string(VMMIPC_VERSION_PATCH),
            VMMIPC_VERSION_STRING);
}

}  // namespace
}  // namespace vmmipc::ledger
