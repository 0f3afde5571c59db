// The background export's mechanism (core/export/background_export.h) with a
// stand-in export function: no thread before the first chunk, one export per
// chunk in order, none while busy work runs (a hold point: the test holds the
// work open, never a sleep), busy work that begins during an export waits
// for that one only, a fork waits for an export in progress, so does the
// exit (the exit gate's close; no export begins after it), the queue's
// bound, and the fd cap's arithmetic (core/export/export_ahead.h).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/exit_gate.h"
#include "core/export/background_export.h"
#include "core/export/export_ahead.h"
#include "thread_watch.h"

namespace vmmipc::core {
namespace {

using ::vmmipc::testing::Eventually;
using ::vmmipc::testing::Sleeps;
using ::vmmipc::testing::ThreadsNamed;

using std::chrono::microseconds;

// What the stand-in export saw, and its hold point.
std::mutex g_mutex;
std::condition_variable g_changed;
std::vector<uint64_t> g_exported;  // bases, in the order exported
bool g_hold = false;               // the next export waits in the hold point until released
bool g_held = false;               // an export waits there now
std::atomic<int> g_sequence{0};
int g_export_ended_at = -1;  // g_sequence when the last export ended

void Reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_exported.clear();
  g_hold = g_held = false;
  g_export_ended_at = -1;
}

void StandInExport(const BackgroundExport::Chunk& chunk) {
  std::unique_lock<std::mutex> lock(g_mutex);
  if (g_hold) {
    g_held = true;
    g_changed.notify_all();
    g_changed.wait(lock, [] { return !g_hold; });
    g_held = false;
  }
  g_exported.push_back(chunk.base);
  g_export_ended_at = g_sequence.fetch_add(1);
  g_changed.notify_all();
}

// Waits (at most 10 s) until `done()` holds under g_mutex.
template <typename Done>
bool WaitFor(Done done) {
  std::unique_lock<std::mutex> lock(g_mutex);
  return g_changed.wait_for(lock, std::chrono::seconds(10), done);
}

size_t Exported() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_exported.size();
}

void Release() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_hold = false;
  g_changed.notify_all();
}

// Lets a held export go at the end of its scope: declared after the
// BackgroundExport, so that its destructor's join never waits on a hold.
struct ReleaseAtEnd {
  ~ReleaseAtEnd() { Release(); }
};

class BackgroundExportTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(); }
  void TearDown() override { Release(); }
};

TEST_F(BackgroundExportTest, NoThreadBeforeTheFirstChunkThenOneExportPerChunkInOrder) {
  BackgroundExport background(microseconds(0), microseconds(0));
  EXPECT_FALSE(background.started());
  for (uint64_t base : {0x1000u, 0x2000u, 0x3000u})
    ASSERT_TRUE(background.Queue({base, 1}, StandInExport, nullptr));
  EXPECT_TRUE(background.started());
  ASSERT_TRUE(WaitFor([] { return g_exported.size() == 3; }));
  EXPECT_EQ(g_exported, (std::vector<uint64_t>{0x1000u, 0x2000u, 0x3000u}));
  EXPECT_EQ(background.queued(), 0u);
}

// The pause: while busy work runs (held open by the test), a queued chunk
// waits, and the thread says so; the work's end lets it go.
TEST_F(BackgroundExportTest, NothingIsExportedWhileBusyWorkRuns) {
  BackgroundExport background(microseconds(0), microseconds(0));
  background.BusyBegins();
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(Eventually([&] { return background.waiting_for_busy(); }))
      << "the thread did not wait for the busy work";
  EXPECT_EQ(Exported(), 0u) << "exported beside busy work";
  EXPECT_EQ(background.queued(), 1u);
  background.BusyBegins();  // a second piece of work, overlapping
  background.BusyEnds();
  EXPECT_EQ(Exported(), 0u);
  EXPECT_TRUE(background.waiting_for_busy());
  background.BusyEnds();  // the last one: the thread goes on
  ASSERT_TRUE(WaitFor([] { return g_exported.size() == 1; }));
}

// Work that begins while an export runs waits for that export only: the
// next queued chunk waits for the work's end.
TEST_F(BackgroundExportTest, BusyWorkThatBeginsDuringAnExportHoldsBackTheNextOne) {
  BackgroundExport background(microseconds(0), microseconds(0));
  ReleaseAtEnd release_at_end;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_hold = true;
  }
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(WaitFor([] { return g_held; }));
  ASSERT_TRUE(background.Queue({0x2000, 1}, StandInExport, nullptr));
  background.BusyBegins();
  Release();
  ASSERT_TRUE(WaitFor([] { return g_exported.size() == 1; }));
  ASSERT_TRUE(Eventually([&] { return background.waiting_for_busy(); }));
  EXPECT_EQ(Exported(), 1u) << "the second chunk was exported beside the busy work";
  background.BusyEnds();
  ASSERT_TRUE(WaitFor([] { return g_exported.size() == 2; }));
}

// After busy work, the thread waits for the quiet period before it exports.
TEST_F(BackgroundExportTest, TheQuietAfterBusyWorkIsWaitedFor) {
  BackgroundExport background(microseconds(0), microseconds(200000));
  background.BusyBegins();
  background.BusyEnds();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(WaitFor([] { return g_exported.size() == 1; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
}

// A fork (its prepare handler) that comes while an export runs waits for it
// to end: the child never holds an export's fd outside the cache. The
// forking thread is seen blocked (a futex wait) before the export is let go.
TEST_F(BackgroundExportTest, AForkWaitsForTheExportInProgress) {
  BackgroundExport background(microseconds(0), microseconds(0));
  ReleaseAtEnd release_at_end;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_hold = true;
  }
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(WaitFor([] { return g_held; }));
  std::atomic<pid_t> tid{0};
  std::atomic<int> prepared_at{-1};
  std::thread forker([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    background.PrepareFork();
    prepared_at = g_sequence.fetch_add(1);
    background.ParentAfterFork();
  });
  ASSERT_TRUE(Eventually([&] { return tid != 0; }));
  const bool blocked =
      Eventually([&] { return Sleeps(tid) || prepared_at >= 0; }) && prepared_at < 0;
  Release();
  forker.join();
  EXPECT_TRUE(blocked) << "the fork's prepare handler did not wait for the export";
  EXPECT_LT(g_export_ended_at, prepared_at.load());
}

// The exit (the exit gate's close, common/exit_gate.h) that comes while an
// export runs waits for it to end, and no export begins after it: the chunk
// queued behind stays queued and the thread ends. The closing thread is seen
// blocked before the export is let go.
TEST_F(BackgroundExportTest, AnExitWaitsForTheExportInProgressAndNoneBeginsAfter) {
  BackgroundExport background(microseconds(0), microseconds(0));
  ReleaseAtEnd release_at_end;
  struct ReopenAtEnd {
    ~ReopenAtEnd() { ReopenExitGateForTests(); }
  } reopen_at_end;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_hold = true;
  }
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(WaitFor([] { return g_held; }));
  ASSERT_TRUE(background.Queue({0x2000, 1}, StandInExport, nullptr));
  std::atomic<pid_t> tid{0};
  std::atomic<int> closed_at{-1};
  std::atomic<bool> none_left{false};
  std::thread closer([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    none_left = CloseExitGate();
    closed_at = g_sequence.fetch_add(1);
  });
  const bool blocked = Eventually([&] { return tid != 0; }) &&
                       Eventually([&] { return Sleeps(tid) || closed_at >= 0; }) && closed_at < 0;
  Release();
  closer.join();
  EXPECT_TRUE(blocked) << "the exit did not wait for the export";
  EXPECT_TRUE(none_left);
  EXPECT_LT(g_export_ended_at, closed_at.load());
  // The thread ends by itself, without taking the chunk behind.
  EXPECT_TRUE(Eventually([] { return ThreadsNamed("vmmipc-export") == 0; }))
      << "the thread went on after the exit";
  EXPECT_EQ(background.queued(), 1u) << "the chunk behind the export was taken";
  EXPECT_EQ(Exported(), 1u) << "an export began after the exit";
}

// The queue's bound: past it a chunk is left to its get (false).
TEST_F(BackgroundExportTest, PastItsBoundTheQueueLeavesChunksToTheirGet) {
  BackgroundExport background(microseconds(0), microseconds(0));
  ReleaseAtEnd release_at_end;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_hold = true;
  }
  ASSERT_TRUE(background.Queue({0x1000, 1}, StandInExport, nullptr));
  ASSERT_TRUE(WaitFor([] { return g_held; }));
  for (size_t i = 0; i < BackgroundExport::kMaxQueued; ++i)
    ASSERT_TRUE(background.Queue({0x10000 + i, 1}, StandInExport, nullptr)) << i;
  EXPECT_FALSE(background.Queue({0x1, 1}, StandInExport, nullptr));
  Release();
}

TEST(BackgroundExportCap, HalfTheCacheAndAQuarterOfTheFreeFds) {
  EXPECT_EQ(BackgroundExportCap(1024, 0, 100000), 512u);
  EXPECT_EQ(BackgroundExportCap(1024, 10, 8), 12u);
  EXPECT_EQ(BackgroundExportCap(4, 0, 1000), 2u);
  EXPECT_EQ(BackgroundExportCap(1024, 5, 0), 5u);  // nothing free: no more than now
  EXPECT_EQ(BackgroundExportCap(1, 0, 1000), 0u);  // a cache of one: never
}

}  // namespace
}  // namespace vmmipc::core
