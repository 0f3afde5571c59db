// The import side's prefetched fds against follow's events
// (core/import/ahead/import_prefetch.cc; the order in core/import/import_side.h):
// each interleaving of an open that keeps or takes a prefetched run with an
// event about it, forced by making the calls in that order, as the open and
// the follow thread make them. The follow thread's own order is: log the
// event for the opens in flight, then drop what is kept.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/import/follow_import.h"
#include "core/import/import_side.h"
#include "test_process.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::core {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
const ledger::ExporterId kExporter{4242, 0x77};

// One prefetched run of one 2 MiB chunk at `base` (its own region).
std::vector<ledger::PrefetchedChunk> OneChunkRun(uint64_t base) {
  std::vector<ledger::PrefetchedChunk> run;
  run.push_back({base, 2 * kMiB, 5, base, base + 2 * kMiB,
                 ScopedFd(memfd_create("prefetched", MFD_CLOEXEC))});
  return run;
}

ledger::FollowEvent PauseOf(uint64_t base) {
  ledger::FollowEvent event;
  event.base = base;
  event.size = 2 * kMiB;
  event.generation = 5;
  return event;
}

ledger::OpenKey KeyOf(uint64_t address) {
  ledger::OpenKey key;
  key.exporter = kExporter;
  key.address = address;
  return key;
}

class ImportPrefetch : public ::testing::Test {
 protected:
  void SetUp() override { fds_before_ = OwnFdsAtRest(); }
  // This process's fds at rest, but the reaper's inbox (it stays from its first use).
  static int OwnFdsAtRest() {
    const int fds =
        testing::RestingFdCount([] { return transport::ReaperPendingForTesting() == 0; });
    return fds - static_cast<int>(transport::ReaperHostFdsForTesting());
  }

  // A watch connection to kExporter kept (one end of a socket pair; the
  // other end, the exporter's, stays here and says nothing).
  void Watch() {
    testing::SocketPair pair = testing::SeqpacketPair();
    exporter_end_ = std::move(pair.b);
    transport::WatchConnection connection;
    connection.fd = std::move(pair.a);
    std::string error;
    ASSERT_TRUE(importer_->follow().AddWatch(
        WatchTag(kExporter), std::move(connection),
        [](void**) {
          return std::make_unique<transport::WatchClient>(
              [](uint64_t, const transport::wire::Event&, ScopedFd) {
                return transport::wire::AckStatus::kNotHeld;
              },
              Timeout::Ms(1000));
        },
        &error))
        << error;
    ASSERT_TRUE(importer_->follow().Watches(WatchTag(kExporter)));
  }

  // An open of kExporter in flight, ended with `runs` prefetched by its
  // fetch: how many chunks were kept. The fds not kept are closed.
  size_t EndWithPrefetched(uint64_t in_flight, std::vector<ledger::PrefetchedChunk> run) {
    ImportSide::PrefetchKeep keep;
    keep.runs.push_back(std::move(run));
    keep.watch_tag = WatchTag(kExporter);
    std::vector<ledger::FollowEvent> missed;
    bool overflowed = false;
    ledger::Reopener application;
    EXPECT_FALSE(
        importer_->ReopenOrEndOpen(KeyOf(1), &application, in_flight, &missed, &overflowed, &keep));
    return keep.kept;
  }

  uint64_t Begin() { return importer_->BeginOpen(kExporter, 0); }

  size_t Drop(uint64_t base) {
    std::vector<ledger::PrefetchedChunk> dropped;
    return importer_->DropPrefetched(kExporter, base, false, &dropped);
  }

  std::vector<ledger::PrefetchedChunk> Take(uint64_t base) {
    return importer_->TakePrefetched(kExporter, base, 2 * kMiB, 5, base);
  }

  void TearDown() override {
    importer_.reset();
    exporter_end_.Reset();
    EXPECT_EQ(OwnFdsAtRest(), fds_before_) << "file descriptors leaked";
  }

  std::unique_ptr<ImportSide> importer_ = std::make_unique<ImportSide>();
  ScopedFd exporter_end_;
  int fds_before_ = 0;
};

TEST_F(ImportPrefetch, AnEventLoggedBeforeTheOpenEndsItsFlightKeepsTheRunOut) {
  Watch();
  const uint64_t in_flight = Begin();
  // The follow thread: logged for the open in flight, nothing kept to drop.
  EXPECT_TRUE(importer_->LogForOpensInFlight(kExporter, PauseOf(100 * kMiB)));
  EXPECT_EQ(Drop(100 * kMiB), 0u);
  // The open: its log names the run's chunk, so it is not kept; another is.
  EXPECT_EQ(EndWithPrefetched(in_flight, OneChunkRun(100 * kMiB)), 0u);
  EXPECT_TRUE(Take(100 * kMiB).empty());
  EXPECT_EQ(importer_->prefetched_fd_count(), 0u);
}

TEST_F(ImportPrefetch, ARunKeptBeforeTheEventIsDroppedByIt) {
  Watch();
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(100 * kMiB)), 1u);
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(200 * kMiB)), 1u);
  EXPECT_EQ(importer_->prefetched_fd_count(), 2u);
  // The follow thread: no open in flight to log it for; the drop finds it.
  EXPECT_FALSE(importer_->LogForOpensInFlight(kExporter, PauseOf(100 * kMiB)));
  EXPECT_EQ(Drop(100 * kMiB), 1u);
  EXPECT_TRUE(Take(100 * kMiB).empty());
  EXPECT_EQ(Take(200 * kMiB).size(), 1u);
  EXPECT_EQ(importer_->prefetched_fd_count(), 0u);
}

TEST_F(ImportPrefetch, ARunTakenByAnOpenInFlightHasTheEventInThatOpensLog) {
  Watch();
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(100 * kMiB)), 1u);
  const uint64_t in_flight = Begin();
  std::vector<ledger::PrefetchedChunk> taken = Take(100 * kMiB);
  ASSERT_EQ(taken.size(), 1u);
  // The follow thread, after the take: logged for the open, nothing to drop.
  EXPECT_TRUE(importer_->LogForOpensInFlight(kExporter, PauseOf(100 * kMiB)));
  EXPECT_EQ(Drop(100 * kMiB), 0u);
  bool overflowed = false;
  const std::vector<ledger::FollowEvent> missed = importer_->EndOpen(in_flight, &overflowed);
  ASSERT_EQ(missed.size(), 1u) << "the open would map memory the exporter paused";
  EXPECT_EQ(missed[0].base, 100 * kMiB);
}

TEST_F(ImportPrefetch, NothingIsKeptWithoutAWatchConnectionOrAfterItsLoss) {
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(100 * kMiB)), 0u);
  Watch();
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(100 * kMiB)), 1u);
  // What the watch client's end of the connection does: everything goes.
  std::vector<ledger::PrefetchedChunk> dropped;
  EXPECT_EQ(importer_->DropPrefetched(kExporter, 0, true, &dropped), 1u);
  EXPECT_EQ(importer_->prefetched_fd_count(), 0u);
}

// Import ahead's thread: it imports what is kept (an open takes the handle
// with the fd), and an import that ends after its chunk was taken is
// released, never kept. The fake import of the second chunk waits at a hold
// point: once it is there, the first one's handle is kept (one import after
// the other), and the test takes the second chunk while it is imported.
struct FakeDriver {
  std::mutex mutex;
  std::condition_variable changed;
  bool hold = true;  // the second import and later wait while set
  int entered = 0;
  std::vector<uint64_t> released;
};
FakeDriver g_driver;

bool FakeImport(int fd, uint64_t* handle) {
  std::unique_lock<std::mutex> lock(g_driver.mutex);
  const int nth = ++g_driver.entered;
  g_driver.changed.notify_all();
  g_driver.changed.wait(lock, [&] { return nth < 2 || !g_driver.hold; });
  *handle = 1000 + static_cast<uint64_t>(fd);
  return true;
}

void FakeRelease(uint64_t handle) {
  std::lock_guard<std::mutex> lock(g_driver.mutex);
  g_driver.released.push_back(handle);
  g_driver.changed.notify_all();
}

TEST_F(ImportPrefetch, ImportedAheadTheHandleGoesWithTheFdAndALateImportIsReleased) {
  Watch();
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(100 * kMiB)), 1u);
  EXPECT_EQ(EndWithPrefetched(Begin(), OneChunkRun(200 * kMiB)), 1u);
  ASSERT_TRUE(importer_->StartImportAhead(FakeImport, FakeRelease));
  {
    std::unique_lock<std::mutex> lock(g_driver.mutex);
    ASSERT_TRUE(g_driver.changed.wait_for(lock, std::chrono::seconds(5),
                                          [] { return g_driver.entered == 2; }));
  }
  // The highest address is imported first (ledger/prefetched_fds.h).
  std::vector<ledger::PrefetchedChunk> first = Take(200 * kMiB);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_NE(first[0].imported, 0u) << "the finished import did not go with the fd";
  std::vector<ledger::PrefetchedChunk> second = Take(100 * kMiB);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].imported, 0u) << "an import in progress held up the take";
  {
    std::unique_lock<std::mutex> lock(g_driver.mutex);
    g_driver.hold = false;
    g_driver.changed.notify_all();
    ASSERT_TRUE(g_driver.changed.wait_for(lock, std::chrono::seconds(5), [] {
      return g_driver.released.size() == 1;
    })) << "the late import was not released";
  }
}

TEST_F(ImportPrefetch, AnExporterThatRefusedTheFlagIsRemembered) {
  EXPECT_FALSE(importer_->PrefetchRefusedBy(kExporter));
  importer_->NoPrefetchFrom(kExporter);
  EXPECT_TRUE(importer_->PrefetchRefusedBy(kExporter));
  EXPECT_FALSE(importer_->PrefetchRefusedBy(ledger::ExporterId{4243, 0x77}));
}

}  // namespace
}  // namespace vmmipc::core
