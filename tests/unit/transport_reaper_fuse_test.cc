// A squatter's FUSE file (issue 44 item 4): a same-uid squatter of an
// exporter's name answers every open with a forged reply carrying an fd of a
// FUSE file whose daemon has stopped answering. The reaper takes each
// connection apart in its private table; it must place the fd without
// calling into its filesystem (fd_kind.h's PlaceOf: fstat would send GETATTR,
// close FLUSH, and both wait for ever), so that no reaper thread waits on the
// daemon and the process's opens of an honest exporter go on working while
// the squatter keeps answering. Before, every reaper thread stayed in
// request_wait_answer, and once its inbox was full every open was refused.
// A real FUSE mount (tests/unit/stalling_fuse.h); skipped where this process
// may not mount one. Each test is its own process under ctest. The importer's
// kind check of such a file (a verified peer's) asks the daemon nothing either.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "listener_test_support.h"
#include "stalling_fuse.h"
#include "transport/client/peer_fds.h"
#include "transport/reaper/fd_kind.h"

namespace vmmipc::transport::listener_test {
namespace {

constexpr uint64_t kSquatterCapability = 0x1234567890abcdefULL;
constexpr uint64_t kSquatterAddress = 0x7f1400000000ULL;
// Past the reaper's inbox (kMaxInboxWaiting): were its threads stuck, the
// opens after these would be refused.
constexpr int kSquatterOpens = static_cast<int>(kMaxInboxWaiting) + 100;

// The squatter, in a child: on `listening`, every request is answered with
// a reply whose MAC does not verify, carrying `fuse_fd`.
[[noreturn]] void Squat(int listening, int fuse_fd) {
  while (true) {
    ScopedFd connection(accept4(listening, nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    uint8_t buffer[256];
    ReceivedMessage request;
    if (!ReceiveMessage(connection.get(), buffer, &request, Deadline::AfterMs(5000)).ok()) continue;
    wire::RequestPreamble preamble;
    if (wire::ParseRequestPreamble({buffer, request.length}, &preamble) != wire::WireError::kOk)
      continue;
    wire::ReplyHeader header;
    header.total_chunks = 1;
    header.batch_count = 1;
    const wire::ReplyEntry entry{kSquatterAddress, 4096, 7};
    const SipKey forged = wire::DeriveKey(kSquatterCapability + 1, preamble.exporter_pid);
    const auto reply = wire::EncodeReply(preamble.nonce, forged, header, {&entry, 1});
    const int fds[1] = {fuse_fd};
    (void)SendMessage(connection.get(), reply, fds, Deadline::AfterMs(5000));
  }
}

// This process's fds at rest, the reaper's inbox aside (it stays from its
// first use).
int OwnFdsAtRest() {
  const int fds = vmmipc::testing::RestingFdCount([] { return ReaperPendingForTesting() == 0; });
  return fds - static_cast<int>(ReaperHostFdsForTesting());
}

TEST(ReaperFuse, AStalledFuseDaemonHoldsNoReaperThreadAndHonestOpensGoOn) {
  const int fds_at_rest = OwnFdsAtRest();
  vmmipc::testing::StallingFuse fuse;
  std::string why;
  if (!fuse.Mount(&why)) GTEST_SKIP() << "no FUSE mount here (" << why << ")";
  // The squatter's name and request.
  const uint32_t squatter_pid = FakePid();
  const SocketAddress address = AbstractAddress(squatter_pid);
  ScopedFd listening(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(listening.get(), address.get(), address.length), 0);
  ASSERT_EQ(listen(listening.get(), 128), 0);
  FetchRequest squatted;
  squatted.handle.exporter_pid = squatter_pid;
  squatted.capability = kSquatterCapability;
  squatted.handle.address = squatted.handle.chunk_base = squatted.handle.region_base =
      kSquatterAddress;
  squatted.handle.chunk_size = 4096;
  squatted.handle.generation = 7;
  // The FUSE file, opened while the daemon answers, in the squatter only:
  // our copy is closed (its FLUSH answered) before the daemon stalls.
  ScopedFd fuse_file(::open(fuse.file().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fuse_file.valid()) << "open " << fuse.file() << ": " << strerror(errno);
  const pid_t squatter = fork();
  ASSERT_GE(squatter, 0);
  if (squatter == 0) {
    fuse.CloseDeviceInChild();
    Squat(listening.get(), fuse_file.get());
  }
  fuse_file.Reset();
  listening.Reset();
  fuse.Stall();

  ClientOptions client = Client(2000);
  // Back to back: on a loaded machine the reaper may fall behind, and an
  // open may then be refused while its inbox is full (busy, not stuck: it
  // drains below); each other one is refused as forged.
  int unauthentic = 0, busy = 0;
  for (int i = 0; i < kSquatterOpens; ++i) {
    const FetchStatus status = FetchChunks(squatted, client).status;
    unauthentic += status == FetchStatus::kUnauthentic ? 1 : 0;
    busy += status == FetchStatus::kNoResources ? 1 : 0;
  }
  // The reaper takes every connection apart, within a bound (stuck on the
  // daemon, it never would).
  const auto drain = Clock::now();
  while (ReaperPendingForTesting() > 0 && ElapsedMs(drain) < 5000) usleep(1000);
  const long drained_ms = ElapsedMs(drain);
  const size_t pending_after_flood = ReaperPendingForTesting();
  // An honest exporter of this process's uid, opened while the squatter
  // keeps answering (one of its answers after each of ours).
  const uint32_t honest_pid = FakePid();
  auto honest = MustStart(Options(honest_pid, 2000), ChunksHandler(1));
  int honest_ok = 0;
  for (int i = 0; i < 20; ++i) {
    FetchResult r = FetchChunks(Request(honest_pid), client);
    honest_ok += r.status == FetchStatus::kOk ? 1 : 0;
    if (r.status != FetchStatus::kOk) ADD_FAILURE() << "honest open " << i << ": " << r.detail;
    (void)FetchChunks(squatted, client);
  }
  // Every hand-over disposed of (none waits on the daemon), within a bound.
  const auto start = Clock::now();
  while (ReaperPendingForTesting() > 0 && ElapsedMs(start) < 5000) usleep(1000);
  const size_t pending = ReaperPendingForTesting();
  const int unanswered = fuse.unanswered();
  std::printf(
      "[ bound    ] %d opens answered by a squatter's FUSE file (%d refused as forged, %d while "
      "the reaper was busy), drained in %ld ms; then 20 honest opens: %d worked; the stalled "
      "daemon was asked %d times; %zu reaper threads, %zu fds still waiting for them (table "
      "%s)\n",
      kSquatterOpens, unauthentic, busy, drained_ms, honest_ok, unanswered,
      ReaperThreadsForTesting(), pending,
      ReaperTableInUse() == ReaperTable::kPrivate ? "private" : "shared");
  EXPECT_EQ(unauthentic + busy, kSquatterOpens);
  EXPECT_EQ(pending_after_flood, 0u) << "reaper threads wait on the FUSE daemon";
  EXPECT_EQ(honest_ok, 20);
  EXPECT_EQ(pending, 0u) << "reaper threads wait on the FUSE daemon";
  EXPECT_EQ(unanswered, 0) << "something asked the stalled FUSE daemon";
  honest.reset();
  // The daemon's connection ends first: a process that closes its copy of
  // the FUSE file (the squatter, at its exit) waits for FLUSH until then.
  fuse.Abort();
  kill(squatter, SIGKILL);
  waitpid(squatter, nullptr, 0);
  // What the reaper keeps of the squatter's is in its own table, not ours.
  EXPECT_EQ(OwnFdsAtRest(), fds_at_rest) << "file descriptors leaked";
}

// The kind checks of the host's threads (the importer's of a verified
// answer's fds, the reaper's last resort) on the stalled daemon's file:
// placed by /proc and statx's cache alone, refused as no device memory and
// kept rather than closed, at once, without a request to the daemon
// (before: fstat sent GETATTR, and the check waited for ever).
TEST(ReaperFuse, TheKindChecksOfAStalledFuseFileAskTheDaemonNothing) {
  vmmipc::testing::StallingFuse fuse;
  std::string why;
  if (!fuse.Mount(&why)) GTEST_SKIP() << "no FUSE mount here (" << why << ")";
  ScopedFd fuse_file(::open(fuse.file().c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fuse_file.valid()) << "open " << fuse.file() << ": " << strerror(errno);
  ScopedFd memfd(memfd_create("kind-check", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  fuse.Stall();
  std::atomic<bool> done{false};
  bool memory = true, every_close_waits = false, never_waits = true;
  std::string what;
  FdPlace place = FdPlace::kUntold;
  std::thread check([&] {
    place = PlaceOf(fuse_file.get());
    memory = IsMemoryFdKind(fuse_file.get(), &what);
    every_close_waits = EveryCloseMayWait(fuse_file.get());
    never_waits = CloseNeverWaits(fuse_file.get());
    done = true;
  });
  const auto start = Clock::now();
  while (!done.load() && ElapsedMs(start) < 2000) usleep(1000);
  const bool returned = done.load();
  const int unanswered = fuse.unanswered();
  // Whatever waits on the daemon fails once its connection ends.
  fuse.Abort();
  check.join();
  fuse_file.Reset();  // after the abort: its FLUSH fails at once
  EXPECT_TRUE(returned) << "a kind check waited on the stalled FUSE daemon";
  EXPECT_EQ(unanswered, 0) << "a kind check asked the stalled FUSE daemon";
  EXPECT_EQ(place, FdPlace::kListedMayWait);
  EXPECT_FALSE(memory);
  EXPECT_TRUE(every_close_waits);
  EXPECT_FALSE(never_waits);
  std::printf("[ refused  ] %s\n", what.c_str());
  // A memfd is still device memory, told by its mount alone.
  EXPECT_EQ(PlaceOf(memfd.get()), FdPlace::kKernel);
  std::string memfd_why;
  EXPECT_TRUE(IsMemoryFdKind(memfd.get(), &memfd_why)) << memfd_why;
  EXPECT_TRUE(CloseNeverWaits(memfd.get()));
  EXPECT_FALSE(EveryCloseMayWait(memfd.get()));
}

}  // namespace
}  // namespace vmmipc::transport::listener_test
