// The replies queued for the listener's workers (issue 36 item 6): each holds
// its connection and its chunks' fds until a worker sends it, so the queue
// is inside the fd budget (fd_budget.h): past its share of the free fds a
// reply is refused (kInternal, which the importer reads) instead of queued.
// The workers are held busy by a hold point (a task posted to them), never
// by a sleep; the exporter's fds are counted at rest.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include "listener_test_support.h"
#include "transport/serve/fd_budget.h"

namespace vmmipc::transport {
namespace {

using namespace listener_test;  // NOLINT(build/namespaces): the shared helpers
using vmmipc::testing::RestingFdCount;

// The soft RLIMIT_NOFILE of this process at `limit` (the hard limit if that
// is lower) while it lives, so that the fd budget's share is the same on
// every machine; restored after.
class SoftFdLimit {
 public:
  explicit SoftFdLimit(rlim_t limit) {
    if (getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min(limit, saved_.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &lowered) == 0) value_ = lowered.rlim_cur;
  }
  ~SoftFdLimit() {
    if (value_ != 0) setrlimit(RLIMIT_NOFILE, &saved_);
  }
  size_t value() const { return value_; }

 private:
  rlimit saved_{};
  size_t value_ = 0;
};

bool ReaperIdle() { return ReaperPendingForTesting() == 0; }

// Before, a reply longer than one message waited for a worker with its
// connection and every chunk's fd, without a bound: 20 such requests while
// the one worker was busy held 20 x 301 fds of the exporter. Now the queue
// holds at most an eighth of the free fds (one reply whatever its size when
// none waits); each request past that is refused kInternal at once, its fds
// closed, and the importer reads the refusal.
TEST_F(TransportListener, RepliesQueuedForABusyWorkerHoldABoundedShareOfTheFds) {
  constexpr size_t kChunks = 300;               // two messages: a worker sends it
  constexpr size_t kFdsPerReply = kChunks + 1;  // its chunks and its connection
  const SoftFdLimit limit(8192);
  ASSERT_NE(limit.value(), 0u);
  const int open_at_start = RestingFdCount(ReaperIdle);
  // As many requests as the limit leaves room for without the bound, 20 at most.
  const int requests = static_cast<int>(std::min<size_t>(
      20, (limit.value() - static_cast<size_t>(open_at_start) - 64) / (kFdsPerReply + 1)));
  if (requests < 4) GTEST_SKIP() << "RLIMIT_NOFILE " << limit.value() << " is too low";
  // The listener's share, measured as it starts with fewer fds open than this
  // count: its own cap is this one or lower.
  const size_t bound = std::max(
      CapsFor(limit.value(), static_cast<size_t>(open_at_start), 0).queued_reply_fds, kFdsPerReply);
  const uint32_t pid = FakePid();
  std::atomic<int> calls{0};
  {
    auto listener = MustStart(OneWorker(pid), ByAddress(kChunks, &calls));
    ASSERT_NE(listener, nullptr);
    const std::shared_ptr<WorkerHold> hold = HoldTheWorker(listener.get());
    ASSERT_NE(hold, nullptr) << "the worker never took the posted task";
    const int before = RestingFdCount(ReaperIdle);
    std::vector<RawImporter> importers;
    for (int i = 0; i < requests; ++i)
      importers.push_back(SendRawRequest(pid, kLongReplyAddress, static_cast<uint8_t>(i)));
    // Every request answered by the poll thread: queued, or refused.
    const auto start = Clock::now();
    while (calls.load() < requests && ElapsedMs(start) < 10000) usleep(1000);
    ASSERT_EQ(calls.load(), requests);
    const int at_rest = RestingFdCount(ReaperIdle);
    // The importers' own sockets aside, what the exporter holds for its queue.
    const int held = at_rest - before - requests;
    std::printf(
        "%d requests for %zu-chunk replies while the one worker was busy: the exporter held %d "
        "fds for them at rest (bound %zu: an eighth of the free fds under RLIMIT_NOFILE %zu, "
        "at most %zu, one reply whatever its size)\n",
        requests, kChunks, held, bound, limit.value(), kMaxQueuedReplyFds);
    EXPECT_LE(static_cast<size_t>(held), bound);
    hold->Release();
    int granted = 0;
    int refused = 0;
    for (const RawImporter& importer : importers) {
      const int status = importer.ReadReply(5000);
      if (status == 0) ++granted;
      if (status == static_cast<int>(RefuseReason::kInternal)) ++refused;
    }
    std::printf("%d granted, %d refused kInternal\n", granted, refused);
    EXPECT_GE(granted, 1);
    EXPECT_EQ(granted + refused, requests) << "an importer got neither its reply nor a refusal";
    EXPECT_EQ(static_cast<size_t>(held), granted * kFdsPerReply)
        << "the fds held were not those of the queued replies";
  }
  ExpectNoFdLeak();
}

}  // namespace
}  // namespace vmmipc::transport
