// The rate limit of repeatable log lines (common/log_limit.h) on an injected
// clock: the first lines of a window pass, the first one past the limit is
// flagged, the rest are counted, and the next window's first line carries
// the count; concurrent callers; a forked child's own counts; and the lines
// Admitted writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log_limit.h"

namespace vmmipc::log {
namespace {

using ::testing::HasSubstr;

TEST(LineLimit, FirstLinesPassThenTheRestAreCountedAndSaidInTheNextWindow) {
  LineLimit limit(3, 1000);
  const int64_t t0 = 5000000;
  for (int i = 0; i < 3; ++i) {
    const LineLimit::Verdict v = limit.Admit(t0 + i);
    EXPECT_TRUE(v.write) << i;
    EXPECT_EQ(v.left_out, 0u) << i;
    EXPECT_FALSE(v.limit_reached) << i;
  }
  // The first line past the limit says so; the others are only counted.
  LineLimit::Verdict v = limit.Admit(t0 + 10);
  EXPECT_FALSE(v.write);
  EXPECT_TRUE(v.limit_reached);
  for (int i = 0; i < 996; ++i) {
    v = limit.Admit(t0 + 999);  // the window's last millisecond
    EXPECT_FALSE(v.write);
    EXPECT_FALSE(v.limit_reached);
    EXPECT_EQ(v.left_out, 0u);
  }
  // A window later: the line passes, with the count of what was left out.
  v = limit.Admit(t0 + 1000);
  EXPECT_TRUE(v.write);
  EXPECT_EQ(v.left_out, 997u);
  EXPECT_FALSE(v.limit_reached);
  // Counted once: the window's next lines carry nothing.
  v = limit.Admit(t0 + 1001);
  EXPECT_TRUE(v.write);
  EXPECT_EQ(v.left_out, 0u);
}

TEST(LineLimit, QuietWindowsSayNothing) {
  LineLimit limit(2, 1000);
  for (int64_t t = 0; t < 10; ++t) {
    const LineLimit::Verdict v = limit.Admit(t * 5000);
    EXPECT_TRUE(v.write);
    EXPECT_EQ(v.left_out, 0u);
    EXPECT_FALSE(v.limit_reached);
  }
}

// A window opens at the first line after the last one ended, not on a grid:
// lines left out long ago are said with the next line, however late.
TEST(LineLimit, TheCountWaitsForTheNextLine) {
  LineLimit limit(1, 1000);
  EXPECT_TRUE(limit.Admit(0).write);
  EXPECT_FALSE(limit.Admit(1).write);
  EXPECT_FALSE(limit.Admit(2).write);
  const LineLimit::Verdict v = limit.Admit(3600000);
  EXPECT_TRUE(v.write);
  EXPECT_EQ(v.left_out, 2u);
  EXPECT_FALSE(limit.Admit(3600999).write);  // that window is full again
}

TEST(LineLimit, ConcurrentCallersGetExactlyTheLimit) {
  LineLimit limit;  // 20 per 10 s
  constexpr int kThreads = 8;
  constexpr int kEach = 5000;
  std::atomic<int> written{0};
  std::atomic<int> reached{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        const LineLimit::Verdict v = limit.Admit(1000);
        if (v.write) ++written;
        if (v.limit_reached) ++reached;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(written.load(), static_cast<int>(LineLimit::kLines));
  EXPECT_EQ(reached.load(), 1);
  const LineLimit::Verdict next = limit.Admit(1000 + LineLimit::kWindowMs);
  EXPECT_TRUE(next.write);
  EXPECT_EQ(next.left_out, uint64_t{kThreads} * kEach - LineLimit::kLines);
}

// A forked child neither inherits a lock (there is none) nor its parent's
// counts: what the parent left out is the parent's to say.
TEST(LineLimit, AForkedChildCountsAfresh) {
  LineLimit limit(1, 1000);
  EXPECT_TRUE(limit.Admit(0).write);
  EXPECT_FALSE(limit.Admit(1).write);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ResetAfterFork();  // what the fork handlers call
    const LineLimit::Verdict v = limit.Admit(2);
    _exit(v.write && v.left_out == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  // The parent's counts are its own still.
  const LineLimit::Verdict v = limit.Admit(1000);
  EXPECT_TRUE(v.write);
  EXPECT_EQ(v.left_out, 1u);
}

TEST(LineLimit, AdmittedWritesTheNoticeAndTheCount) {
  const std::string path =
      ::testing::TempDir() + "vmmipc-log-limit-" + std::to_string(getpid()) + ".log";
  std::filesystem::remove(path);
  SetFile(path);
  SetLevel(Level::kWarn);
  LineLimit limit;  // 20 per 10 s
  int passed = 0;
  for (int i = 0; i < 10000; ++i)
    if (Admitted(limit, Level::kWarn, "cuIpcOpenMemHandle", "warnings", 7000)) ++passed;
  EXPECT_EQ(passed, 20);
  EXPECT_TRUE(Admitted(limit, Level::kWarn, "cuIpcOpenMemHandle", "warnings", 17000));
  SetFile("");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "[vmmipc pid " + std::to_string(getpid()) +
                " unranked] warning: cuIpcOpenMemHandle: more than 20 warnings within 10 s; the "
                "rest are counted, not logged, until then\n"
                "[vmmipc pid " +
                std::to_string(getpid()) +
                " unranked] warning: cuIpcOpenMemHandle: 9980 more warnings were not logged (at "
                "most 20 are per 10 s)\n");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace vmmipc::log
