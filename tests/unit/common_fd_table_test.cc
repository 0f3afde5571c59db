// GrowFdTable: the table grows once to the size asked (within the soft
// RLIMIT_NOFILE), nothing stays open, and a table already that large is left
// alone. The limit case runs in a forked child, whose limit it lowers.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fd_table.h"
#include "test_process.h"

namespace vmmipc {
namespace {

using testing::FdCount;

TEST(FdTable, GrowsOnceToTheSizeAskedAndLeavesNothingOpen) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < 1024) {
    GTEST_SKIP() << "the soft RLIMIT_NOFILE is " << limit.rlim_cur;
  }
  const int before = FdTableSize();
  ASSERT_GT(before, 0) << "no FDSize in /proc/self/status";
  const int fds = FdCount();
  const int want = before * 4;  // beyond the table as it is
  if (limit.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(want) > limit.rlim_cur) {
    GTEST_SKIP() << "the table is already " << before;
  }
  EXPECT_TRUE(GrowFdTable(want));
  EXPECT_GE(FdTableSize(), want);
  EXPECT_EQ(FdCount(), fds);
  // Large enough already: nothing to do.
  EXPECT_FALSE(GrowFdTable(want / 2));
}

TEST(FdTable, StaysWithinTheSoftLimit) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(10);
    const int size = FdTableSize();
    // A soft limit just above the table's size: asking for far more gives the limit at most.
    limit.rlim_cur = static_cast<rlim_t>(size) + 100;
    if (limit.rlim_max != RLIM_INFINITY && limit.rlim_cur > limit.rlim_max) _exit(0);
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(11);
    if (!GrowFdTable(1 << 20)) _exit(12);
    const int grown = FdTableSize();
    // The kernel rounds up to a power of two; never to the size asked.
    if (grown < size + 100 || grown >= (1 << 20)) _exit(13);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace vmmipc
