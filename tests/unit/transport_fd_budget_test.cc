// transport/fd_budget: the caps of each class of connections for the hosts
// of the review (issue 26), and the count of open fds they come from.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "common/scoped_fd.h"
#include "test_process.h"
#include "transport/serve/fd_budget.h"

namespace vmmipc::transport {
namespace {

TEST(TransportFdBudget, CapsAreShareOfTheFreeFds) {
  // The review's host: 600 of 1024 open, 424 free.
  ConnectionCaps caps = CapsFor(1024, 600, 0);
  EXPECT_EQ(caps.own_waiting, 106u);
  EXPECT_EQ(caps.watchers, 106u);
  EXPECT_EQ(caps.others_waiting, 26u);
  EXPECT_EQ(caps.per_other_uid, 13u);
  EXPECT_EQ(caps.queued_reply_fds, 53u);  // the fds of replies waiting for a worker
  // The listener's own connections count as free: the same host, holding 100.
  caps = CapsFor(1024, 700, 100);
  EXPECT_EQ(caps.own_waiting, 106u);
  EXPECT_EQ(caps.watchers, 106u);
  // Plenty of fds: the fixed maxima.
  caps = CapsFor(1 << 20, 100, 0);
  EXPECT_EQ(caps.own_waiting, kMaxOwnWaiting);
  EXPECT_EQ(caps.watchers, kMaxWatchConnections);
  EXPECT_EQ(caps.others_waiting, kMaxOthersWaiting);
  EXPECT_EQ(caps.per_other_uid, kMaxPerOtherUid);
  EXPECT_EQ(caps.queued_reply_fds, kMaxQueuedReplyFds);
  // A host at its limit (or past it, after a lowered limit) is still served, one at a time.
  for (size_t open : {1024u, 2000u}) {
    caps = CapsFor(1024, open, 0);
    EXPECT_EQ(caps.own_waiting, 1u) << open;
    EXPECT_EQ(caps.watchers, 1u) << open;
    EXPECT_EQ(caps.others_waiting, 1u) << open;
    EXPECT_EQ(caps.per_other_uid, 1u) << open;
    EXPECT_EQ(caps.queued_reply_fds, 1u) << open;  // one reply may wait whatever its size
  }
}

TEST(TransportFdBudget, CountOpenFdsCountsThisProcesssFds) {
  // FdCount() counts /proc/self/fd's "." and ".." and the fd reading it too.
  const long before = CountOpenFds();
  ASSERT_GT(before, 0);
  EXPECT_EQ(before + 3, testing::FdCount());
  ScopedFd one(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(one.valid());
  EXPECT_EQ(CountOpenFds(), before + 1);
}

TEST(TransportFdBudget, MeasuresTheProcessAndSeesAnFdNumberItDidNotCount) {
  FdBudget budget;
  budget.Measure(0, false);
  EXPECT_GT(budget.limit(), 0u);
  EXPECT_EQ(budget.free_fds(), budget.limit() - static_cast<size_t>(CountOpenFds()));
  EXPECT_FALSE(budget.Outgrown(3, 0));
  EXPECT_TRUE(budget.Outgrown(static_cast<int>(budget.limit() - 1), 0));
  // Out of fds: all of them are open, whatever /proc would say.
  budget.Measure(0, true);
  EXPECT_EQ(budget.free_fds(), 0u);
  EXPECT_EQ(budget.caps().own_waiting, 1u);
  budget.Measure(40, true);  // 40 of them the listener's
  EXPECT_EQ(budget.free_fds(), 40u);
  EXPECT_EQ(budget.caps().own_waiting, 10u);
  // Measured just now: a refresh waits a second.
  EXPECT_FALSE(budget.Refresh(0));
}

}  // namespace
}  // namespace vmmipc::transport
