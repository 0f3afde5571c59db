// The VMMIPC_STATS counters: counting from many threads, the enum helpers,
// the report's shape, and the exit report written by a process that exits.
#include "core/stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/chunk_grant.h"
#include "transport/client/fetch_client.h"

namespace vmmipc::core::stats {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class StatsTest : public ::testing::Test {
 protected:
  void SetUp() override { ResetForTesting(); }
  void TearDown() override { ResetForTesting(); }
};

TEST_F(StatsTest, CountersStartAtZeroAndAdd) {
  EXPECT_EQ(Get(Counter::kHandlesExported), 0u);
  Count(Counter::kHandlesExported);
  Count(Counter::kHandlesExported);
  Count(Counter::kBytesMapped, 2u << 20);
  EXPECT_EQ(Get(Counter::kHandlesExported), 2u);
  EXPECT_EQ(Get(Counter::kBytesMapped), 2u << 20);
  EXPECT_EQ(Get(Counter::kCloses), 0u);
}

TEST_F(StatsTest, OutOfRangeCountersAreIgnored) {
  Count(Counter::kCount);
  Count(static_cast<Counter>(-1));
  EXPECT_EQ(Get(Counter::kCount), 0u);
  EXPECT_STREQ(Name(Counter::kCount), "unknown");
}

TEST_F(StatsTest, NamesAreUniqueAndSnakeCase) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Counter::kCount); ++i) {
    const std::string name = Name(static_cast<Counter>(i));
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << name;
  }
}

TEST_F(StatsTest, ConcurrentCountsAreNotLost) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < kPerThread; ++i) Count(Counter::kFdsSent);
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(Get(Counter::kFdsSent), uint64_t{kThreads} * kPerThread);
}

TEST_F(StatsTest, FetchFailuresMapToTheirCause) {
  using transport::FetchStatus;
  CountFetchFailure(FetchStatus::kOk);
  CountFetchFailure(FetchStatus::kNoExporter);
  CountFetchFailure(FetchStatus::kTimeout);
  CountFetchFailure(FetchStatus::kTimeout);
  CountFetchFailure(FetchStatus::kRefused);
  CountFetchFailure(FetchStatus::kUnauthentic);
  CountFetchFailure(FetchStatus::kProtocolError);
  CountFetchFailure(FetchStatus::kNoResources);
  EXPECT_EQ(Get(Counter::kOpenFailedNoExporter), 1u);
  EXPECT_EQ(Get(Counter::kOpenFailedTimeout), 2u);
  EXPECT_EQ(Get(Counter::kOpenFailedRefused), 1u);
  EXPECT_EQ(Get(Counter::kOpenFailedUnauthentic), 1u);
  EXPECT_EQ(Get(Counter::kOpenFailedProtocol), 1u);
  EXPECT_EQ(Get(Counter::kOpenFailedNoResources), 1u);
}

TEST_F(StatsTest, RefusalsMapToTheirReason) {
  using transport::RefuseReason;
  const std::pair<RefuseReason, Counter> cases[] = {
      {RefuseReason::kBadToken, Counter::kRefusedBadToken},
      {RefuseReason::kWrongUser, Counter::kRefusedWrongUser},
      {RefuseReason::kNotExported, Counter::kRefusedNotExported},
      {RefuseReason::kFreed, Counter::kRefusedFreed},
      {RefuseReason::kExportFailed, Counter::kRefusedExportFailed},
      {RefuseReason::kTooManyChunks, Counter::kRefusedTooManyChunks},
      {RefuseReason::kInternal, Counter::kRefusedInternal},
      {RefuseReason::kBadRequest, Counter::kRefusedBadRequest},
  };
  CountRefusal(RefuseReason::kNone);
  for (const auto& [reason, counter] : cases) {
    CountRefusal(reason);
    EXPECT_EQ(Get(counter), 1u) << Name(counter);
  }
}

TEST_F(StatsTest, ReportListsEveryCounterOfASectionThatRanAndOnlyNonzeroFailures) {
  Count(Counter::kHandlesExported, 3);
  Count(Counter::kBytesMapped, 3u << 20);
  Count(Counter::kBytesUnmapped, (3u << 20) / 2);
  Count(Counter::kOpenFailedTimeout);
  const std::string report = Format();
  EXPECT_THAT(report, HasSubstr("stats at exit"));
  EXPECT_THAT(report, HasSubstr("export: handles_exported=3 export_refused_no_posix_fd=0 "));
  EXPECT_THAT(report, HasSubstr("import: handles_opened=0 "));
  EXPECT_THAT(report, HasSubstr("bytes_mapped=3145728"));
  EXPECT_THAT(report, HasSubstr("(mapped 3 MiB, unmapped 1.5 MiB)"));
  EXPECT_THAT(report, HasSubstr("open failures: open_failed_timeout=1"));
  EXPECT_THAT(report, Not(HasSubstr("open_failed_no_exporter")));
  EXPECT_NE(report.back(), '\n');
}

// A section where nothing was counted is one word, not a row of zeros.
TEST_F(StatsTest, SectionsWhereNothingHappenedSayNone) {
  std::string report = Format();
  EXPECT_THAT(report, HasSubstr("\n  export: none\n"));
  EXPECT_THAT(report, HasSubstr("\n  listener: none\n"));
  EXPECT_THAT(report, HasSubstr("\n  import: none\n"));
  EXPECT_THAT(report, HasSubstr("\n  open failures: none"));
  EXPECT_THAT(report, Not(HasSubstr("=0")));
  // One refusal is enough for the listener's whole section, zeros included.
  Count(Counter::kRefusedFreed);
  report = Format();
  EXPECT_THAT(report, HasSubstr("listener: requests_served=0 "));
  EXPECT_THAT(report, HasSubstr("; refusals: refused_freed=1\n"));
  EXPECT_THAT(report, HasSubstr("export: none\n"));
  EXPECT_THAT(report, HasSubstr("import: none\n"));
  // A connection reaped (the last counter of the section) counts too.
  ResetForTesting();
  Count(Counter::kConnectionsReaped);
  EXPECT_THAT(Format(), HasSubstr("connections_reaped=1; refusals: none\n"));
}

TEST_F(StatsTest, ForkedChildStartsFromZero) {
  Count(Counter::kHandlesOpened, 5);
  ResetAfterFork();
  EXPECT_EQ(Get(Counter::kHandlesOpened), 0u);
}

// The report is written by the exit handler, once, with the log prefix on
// every line, even though the log level would hide info lines.
TEST(StatsDeathTest, ExitReportIsWrittenOnceWhenTheProcessExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::vmmipc::log::SetLevel(::vmmipc::log::Level::kOff);
        Count(Counter::kHandlesExported, 7);
        Count(Counter::kFdsReceived, 2);
        EnableExitReport();
        EnableExitReport();  // a second call must not print a second block
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "\\] info: vmmipc [0-9.]+ stats at exit:\n"
      "\\[vmmipc pid [0-9]+ [a-z0-9 ]+\\] info:   export: handles_exported=7 [^\n]*\n"
      "[^\n]*listener: [^\n]*\n"
      "[^\n]*import: [^\n]*fds_received=2[^\n]*\n"
      "[^\n]*open failures: none\n$");
}

}  // namespace
}  // namespace vmmipc::core::stats
