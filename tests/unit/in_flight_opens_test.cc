// ledger/in_flight_opens: the events an open in flight missed, and how they
// change the run it fetched (issue 24: an open in flight during a pause must
// neither map the released memory nor miss the resume).
#include "ledger/in_flight_opens.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>

namespace vmmipc::ledger {
namespace {

constexpr uint64_t kChunk = 0x200000;
const ExporterId kExporter{42, 7};

FollowEvent Pause(uint64_t base, uint32_t generation) {
  return FollowEvent{false, base, kChunk, generation, nullptr};
}

FollowEvent Resume(uint64_t base, uint32_t generation, uint64_t size = kChunk) {
  return FollowEvent{true, base, size, generation,
                     std::make_shared<ScopedFd>(::eventfd(0, EFD_CLOEXEC))};
}

std::vector<FetchedChunk> TwoChunks() {
  return {{0x1000000, kChunk, 5, 100, false, false, nullptr},
          {0x1000000 + kChunk, kChunk, 6, 101, false, false, nullptr}};
}

// An open that took its log stays listed (its placement lock) until it
// ends, and is logged nothing more: the follow thread waits for its lock and
// finds its record instead.
TEST(InFlightOpens, AnOpenThatTookItsLogKeepsItsLockListedAndIsLoggedNothingMore) {
  InFlightOpens opens;
  const uint64_t id = opens.Begin(kExporter, 3);
  EXPECT_TRUE(opens.Log(kExporter, Pause(0x1000000, 5)));
  bool overflowed = true;
  EXPECT_EQ(opens.TakeLog(id, &overflowed).size(), 1u);
  EXPECT_FALSE(overflowed);
  EXPECT_EQ(opens.LockIndexes(kExporter), std::vector<size_t>{3});
  EXPECT_FALSE(opens.Log(kExporter, Pause(0x1000000 + kChunk, 6)));
  EXPECT_TRUE(opens.TakeLog(id, &overflowed).empty());  // taken once
  EXPECT_TRUE(opens.End(id, &overflowed).empty());
  EXPECT_TRUE(opens.LockIndexes(kExporter).empty());
  EXPECT_EQ(opens.size(), 0u);
}

TEST(InFlightOpens, EventsAreLoggedOnlyForOpensOfTheirExporterInFlight) {
  InFlightOpens opens;
  EXPECT_FALSE(opens.Log(kExporter, Pause(0x1000000, 5)));  // nobody in flight
  const uint64_t mine = opens.Begin(kExporter, 3);
  const uint64_t other = opens.Begin(ExporterId{43, 7}, 9);
  EXPECT_TRUE(opens.Log(kExporter, Pause(0x1000000, 5)));
  EXPECT_EQ(opens.LockIndexes(kExporter), std::vector<size_t>{3});
  bool overflowed = true;
  EXPECT_EQ(opens.End(mine, &overflowed).size(), 1u);
  EXPECT_FALSE(overflowed);
  EXPECT_TRUE(opens.End(other, &overflowed).empty());
  EXPECT_EQ(opens.size(), 0u);
  EXPECT_TRUE(opens.LockIndexes(kExporter).empty());
}

TEST(InFlightOpens, TooManyEventsOverflowTheOpenInsteadOfDroppingOne) {
  InFlightOpens opens;
  const uint64_t id = opens.Begin(kExporter, 0);
  for (size_t i = 0; i <= InFlightOpens::kMaxEvents; ++i) opens.Log(kExporter, Pause(i, 1));
  bool overflowed = false;
  EXPECT_EQ(opens.End(id, &overflowed).size(), InFlightOpens::kMaxEvents);
  EXPECT_TRUE(overflowed);
}

TEST(ApplyFollowEvents, AnUnfollowedEventIsSeenByTheOpenAndAppliesToNoChunk) {
  InFlightOpens opens;
  const ExporterId exporter{7, 1};
  const uint64_t id = opens.Begin(exporter, 0);
  FollowEvent pause;
  pause.base = 0x1000;
  pause.size = 0x1000;
  FollowEvent unfollowed;
  unfollowed.unfollowed = true;
  EXPECT_TRUE(opens.Log(exporter, pause));
  EXPECT_TRUE(opens.Log(exporter, unfollowed));
  bool overflowed = true;
  const std::vector<FollowEvent> events = opens.End(id, &overflowed);
  EXPECT_FALSE(overflowed);
  EXPECT_TRUE(AnyUnfollowed(events));
  EXPECT_FALSE(AnyUnfollowed({pause}));
  std::vector<FetchedChunk> run = {{0, 0x1000, 0, 5, false, false, nullptr}};
  ApplyFollowEvents({unfollowed}, &run);
  EXPECT_FALSE(run[0].paused);
  EXPECT_EQ(run[0].fd, 5);
}

TEST(ApplyFollowEvents, APauseOfTheGrantedGenerationLeavesNothingToMap) {
  std::vector<FetchedChunk> run = TwoChunks();
  ApplyFollowEvents({Pause(0x1000000 + kChunk, 6)}, &run);
  EXPECT_FALSE(run[0].paused);
  EXPECT_EQ(run[0].fd, 100);
  EXPECT_TRUE(run[1].paused);
  EXPECT_EQ(run[1].fd, -1);
}

TEST(ApplyFollowEvents, APauseOfAnotherGenerationIsNotThisRunsMemory) {
  std::vector<FetchedChunk> run = TwoChunks();
  ApplyFollowEvents({Pause(0x1000000, 4)}, &run);  // an older generation at the same base
  EXPECT_FALSE(run[0].paused);
  EXPECT_EQ(run[0].fd, 100);
}

TEST(ApplyFollowEvents, PauseThenResumeMapsTheNewMemory) {
  std::vector<FetchedChunk> run = TwoChunks();
  const FollowEvent resume = Resume(0x1000000, 9);
  ApplyFollowEvents({Pause(0x1000000, 5), resume}, &run);
  EXPECT_FALSE(run[0].paused);
  EXPECT_EQ(run[0].generation, 9u);
  EXPECT_EQ(run[0].fd, resume.fd->get());
  EXPECT_EQ(run[0].resumed_fd, resume.fd);
}

TEST(ApplyFollowEvents, AResumeWithoutAPauseFirstChangesNothing) {
  std::vector<FetchedChunk> run = TwoChunks();
  ApplyFollowEvents({Resume(0x1000000, 9)}, &run);
  EXPECT_EQ(run[0].generation, 5u);
  EXPECT_EQ(run[0].fd, 100);
}

TEST(ApplyFollowEvents, AResumeOfAnotherSizeStaysUnmapped) {
  std::vector<FetchedChunk> run = TwoChunks();
  ApplyFollowEvents({Pause(0x1000000, 5), Resume(0x1000000, 9, 2 * kChunk)}, &run);
  EXPECT_TRUE(run[0].paused);
  EXPECT_TRUE(run[0].refused);
  EXPECT_EQ(run[0].fd, -1);
}

TEST(ApplyFollowEvents, PauseResumePauseEndsPaused) {
  std::vector<FetchedChunk> run = TwoChunks();
  ApplyFollowEvents({Pause(0x1000000, 5), Resume(0x1000000, 9), Pause(0x1000000, 9)}, &run);
  EXPECT_TRUE(run[0].paused);
  EXPECT_EQ(run[0].generation, 9u);  // the resume's: its resume comes next
  EXPECT_EQ(run[0].resumed_fd, nullptr);
}

}  // namespace
}  // namespace vmmipc::ledger
