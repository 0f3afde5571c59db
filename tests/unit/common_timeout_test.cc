// Timeout: the one value of VMMIPC_TIMEOUT_MS that transport's options take.
#include <gtest/gtest.h>

#include "common/timeout.h"
#include "config/params.h"

namespace vmmipc {
namespace {

TEST(Timeout, IsTheConfiguredMillisecondsAndNeverBelowOne) {
  EXPECT_EQ(Timeout().ms(), 5000);
  EXPECT_EQ(Timeout::Ms(250).ms(), 250);
  EXPECT_EQ(Timeout::Ms(0).ms(), 1);
  EXPECT_EQ(Timeout::Ms(-7).ms(), 1);
  EXPECT_EQ(Timeout::Ms(int64_t{1} << 40).ms(), std::numeric_limits<int>::max());
}

TEST(Timeout, ComesFromTheConfiguration) {
  config::Params params;
  EXPECT_EQ(params.timeout().ms(), 5000);
  params.timeout_ms = 3600000;
  EXPECT_EQ(params.timeout().ms(), 3600000);
}

}  // namespace
}  // namespace vmmipc
