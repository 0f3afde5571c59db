// GrowFdTable: the table grows once to the size asked (within the soft
// RLIMIT_NOFILE), nothing stays open, a table already that large is left
// alone, and the process's POSIX record locks survive it (it duplicates an fd
// of its own, never one of the process's: a close of any copy of a file drops
// every record lock the process holds on it). The limit and lock cases run in
// forked children.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "common/fd_table.h"
#include "common/scoped_fd.h"
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

TEST(FdTable, StatusGivesTheSizeAndTheThreadsInOnePass) {
  const FdTableStatus status = ReadFdTableStatus();
  EXPECT_GE(status.size, 64);
  EXPECT_GE(status.threads, 1);
  EXPECT_EQ(FdTableSize(), status.size);
}

// Runs `body` in a forked child (one thread, as at load time, unless `body`
// starts more) and returns its exit status; 0 is success.
template <typename Body>
int InChild(Body body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// A fresh child of this test has the test's own table: ask for more than it
// holds. 0 when the soft RLIMIT_NOFILE does not allow that much.
int BeyondTheTable() {
  rlimit limit{};
  const int want = FdTableSize() * 4;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  return limit.rlim_cur != RLIM_INFINITY && static_cast<rlim_t>(want) > limit.rlim_cur ? 0 : want;
}

TEST(FdTable, WhileSingleThreadedItGrows) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer runs a thread of its own: no process here has one thread";
#endif
  if (BeyondTheTable() == 0) GTEST_SKIP() << "the soft RLIMIT_NOFILE is too low";
  EXPECT_EQ(InChild([] {
              const int want = BeyondTheTable();
              if (ReadFdTableStatus().threads != 1) return 10;
              if (GrowFdTableWhileSingleThreaded(want) != EarlyGrowth::kGrown) return 11;
              if (FdTableSize() < want) return 12;
              // Once grown: nothing more to do.
              return GrowFdTableWhileSingleThreaded(want) == EarlyGrowth::kLargeEnough ? 0 : 13;
            }),
            0);
}

// With a second thread the growth would wait for a grace period: left alone.
TEST(FdTable, WithAnotherThreadItIsLeftAlone) {
  if (BeyondTheTable() == 0) GTEST_SKIP() << "the soft RLIMIT_NOFILE is too low";
  EXPECT_EQ(InChild([] {
              int hold[2];
              if (pipe(hold) != 0) return 10;
              std::thread other([&] {
                char c;
                (void)!read(hold[0], &c, 1);
              });
              const int before = FdTableSize();
              const EarlyGrowth growth = GrowFdTableWhileSingleThreaded(BeyondTheTable());
              const int after = FdTableSize();
              close(hold[1]);
              other.join();
              if (growth != EarlyGrowth::kThreaded) return 11;
              return after == before ? 0 : 12;
            }),
            0);
}

// A record lock on a file the process has as fd 0, 1 and 2 (a daemon's log
// or lock file) is still held after the growth: another process (the test)
// cannot take it. The child holds it and waits; the test looks, then ends it.
TEST(FdTable, RecordLocksSurviveTheGrowth) {
  if (BeyondTheTable() == 0) GTEST_SKIP() << "the soft RLIMIT_NOFILE is too low";
  char path[] = "/tmp/vmmipc-fd-table-lock-XXXXXX";
  ScopedFd file(mkstemp(path));
  ASSERT_TRUE(file.valid());
  int grown[2], done[2];
  ASSERT_EQ(pipe2(grown, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(done, O_CLOEXEC), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(grown[0]);
    close(done[1]);  // or its read below would never see the end
    for (int fd = 0; fd <= 2; ++fd)
      if (dup2(file.get(), fd) != fd) _exit(10);
    flock lock{};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fcntl(1, F_SETLK, &lock) != 0) _exit(11);
    const int want = BeyondTheTable();
    char result = GrowFdTable(want) && FdTableSize() >= want ? 'g' : 'n';
    if (write(grown[1], &result, 1) != 1) _exit(12);
    char end = 0;
    (void)!read(done[0], &end, 1);  // held until the test has looked
    _exit(0);
  }
  close(grown[1]);
  close(done[0]);
  char result = 0;
  ASSERT_EQ(read(grown[0], &result, 1), 1);
  EXPECT_EQ(result, 'g') << "the table did not grow";
  flock probe{};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(file.get(), F_GETLK, &probe), 0);
  EXPECT_EQ(probe.l_type, F_WRLCK) << "the growth dropped the child's record lock";
  EXPECT_EQ(probe.l_pid, child);
  close(done[1]);
  close(grown[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  unlink(path);
}

}  // namespace
}  // namespace vmmipc
