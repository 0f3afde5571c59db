// A reaper wedged for good (issue 36 item 1): a same-uid squatter of a dead
// exporter's name answers every open with a forged reply carrying an fd, and
// every disposal of the reaper's threads never returns (the hold point
// SetDisposalHookForTesting stands for a FUSE file whose FLUSH is never
// answered). No close may then run on the importer's thread, and what the
// flood costs the host is bounded: threads, fds waiting in the inbox, fds
// kept open in the host's table. Each test is its own process under ctest.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include "lingering_socket.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;
using vmmipc::testing::ElapsedMs;
using vmmipc::testing::FdCount;

constexpr int kBoundMs = 5000;
constexpr int kLingerS = 3;  // what a close of the squatter's last fd waits
constexpr uint64_t kCapability = 0x1234567890abcdefULL;
constexpr uint64_t kAddress = 0x7f1200000000ULL;

// The hold point: every disposal waits here while held.
std::mutex g_mutex;
std::condition_variable g_changed;
bool g_held = true;
int g_holding = 0;

void HoldEveryDisposal(int) {
  std::unique_lock lock(g_mutex);
  if (!g_held) return;
  ++g_holding;
  g_changed.notify_all();
  g_changed.wait(lock, [] { return !g_held; });
  --g_holding;
}

void Release() {
  {
    std::lock_guard lock(g_mutex);
    g_held = false;
  }
  g_changed.notify_all();
}

// The squatter, in a child process (so that the host's fd count is the
// importer's alone): on `address`, it answers every request with a reply
// whose MAC does not verify, carrying one fd: an eventfd, or once a byte is
// waiting on `control`, a fresh TCP socket whose close lingers kLingerS.
[[noreturn]] void Squat(ScopedFd listening, ScopedFd control) {
  ScopedFd eventfd_fd(eventfd(0, EFD_CLOEXEC));
  ScopedFd keep_listener, keep_server, lingering;
  while (true) {
    ScopedFd connection(accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    uint8_t buffer[256];
    ReceivedMessage request;
    if (!ReceiveMessage(connection.get(), buffer, &request, Deadline::AfterMs(kBoundMs)).ok())
      continue;
    wire::RequestPreamble preamble;
    if (wire::ParseRequestPreamble({buffer, request.length}, &preamble) != wire::WireError::kOk)
      continue;
    char byte = 0;
    if (!lingering.valid() && recv(control.get(), &byte, 1, MSG_DONTWAIT) == 1) {
      lingering = testing::LingeringSocket(kLingerS, &keep_listener, &keep_server);
    }
    wire::ReplyHeader header;
    header.total_chunks = 1;
    header.batch_count = 1;
    const wire::ReplyEntry entry{kAddress, 4096, 7};
    // Not the handle's key: a squatter cannot make one.
    const SipKey forged = wire::DeriveKey(kCapability + 1, preamble.exporter_pid);
    const auto reply = wire::EncodeReply(preamble.nonce, forged, header, {&entry, 1});
    const int fds[1] = {lingering.valid() ? lingering.get() : eventfd_fd.get()};
    (void)SendMessage(connection.get(), reply, fds, Deadline::AfterMs(kBoundMs));
    if (lingering.valid() && byte != 0) lingering.Reset();  // the importer's is the last
  }
}

struct Squatter {
  pid_t pid = -1;
  ScopedFd control;
  FetchRequest request;
  ~Squatter() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

void StartSquatter(Squatter* squatter) {
  const uint32_t fake_pid = 0x10000000u + (static_cast<uint32_t>(getpid()) << 6) + 3;
  SocketAddress address;
  std::string error;
  ASSERT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(fake_pid), "", &address, &error))
      << error;
  ScopedFd listening(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(listening.get(), address.get(), address.length), 0);
  ASSERT_EQ(listen(listening.get(), 64), 0);
  testing::SocketPair control = testing::SeqpacketPair();
  squatter->pid = fork();
  ASSERT_GE(squatter->pid, 0);
  if (squatter->pid == 0) Squat(std::move(listening), std::move(control.b));
  squatter->control = std::move(control.a);
  FetchRequest& request = squatter->request;
  request.handle.exporter_pid = fake_pid;
  request.capability = kCapability;
  request.handle.address = request.handle.chunk_base = request.handle.region_base = kAddress;
  request.handle.chunk_size = 4096;
  request.handle.generation = 7;
}

TEST(ReaperWedged, ASquattersFloodCostsABoundedCountAndNeverACloseOnTheImportersThread) {
  SetDisposalHookForTesting(HoldEveryDisposal);
  Squatter squatter;
  ASSERT_NO_FATAL_FAILURE(StartSquatter(&squatter));
  ClientOptions client;
  client.timeout = Timeout::Ms(2000);
  const int fds_before = testing::RestingFdCount();
  // Opens until the reaper stops taking (refused at once), or, where
  // nothing refuses, until its inbox is full (the count stops growing).
  constexpr int kMaxOpens = 40000;
  int opens = 0, refused = 0, flat = 0, max_fds = fds_before;
  size_t last_pending = 0;
  for (; opens < kMaxOpens && refused == 0 && flat < 200; ++opens) {
    const FetchResult result = FetchChunks(squatter.request, client);
    if (result.status == FetchStatus::kNoResources) ++refused;
    const size_t pending = ReaperPendingForTesting();
    flat = pending > last_pending ? 0 : flat + 1;
    last_pending = pending;
    if (opens % 64 == 0) max_fds = std::max(max_fds, FdCount());
  }
  max_fds = std::max(max_fds, FdCount());
  {
    std::unique_lock lock(g_mutex);
    EXPECT_TRUE(g_changed.wait_for(lock, std::chrono::milliseconds(kBoundMs),
                                   [] { return g_holding == kMaxReaperThreads; }));
  }
  // The squatter's next answer carries a fresh lingering socket: closed on
  // this thread, the open would wait kLingerS.
  ASSERT_EQ(send(squatter.control.get(), "L", 1, MSG_NOSIGNAL), 1);
  const auto start = Clock::now();
  const FetchResult last = FetchChunks(squatter.request, client);
  const long last_ms = ElapsedMs(start);
  std::printf(
      "bound: %d opens to the squatter, then refused (%d); %zu reaper threads stuck (at most "
      "%zu), %zu fds waiting in the inbox (at most %zu), %zu kept open in the host's table (at "
      "most %zu); host fds %d before, at most %d during; the next open took %ld ms (%s)\n",
      opens, refused, ReaperThreadsForTesting(), kMaxReaperThreads, ReaperPendingForTesting(),
      kMaxInboxWaiting, ReaperKeptForTesting(), kMaxKeptOpen, fds_before, max_fds, last_ms,
      FetchStatusName(last.status));
  EXPECT_LT(last_ms, 1000) << "closed on the importer's thread: " << last.detail;
  EXPECT_EQ(last.status, FetchStatus::kNoResources) << last.detail;
  EXPECT_GT(refused, 0);
  // Where the threads run in the host's table (ThreadSanitizer builds, old
  // kernels) what waits in the inbox is the host's fds, and fewer may.
  const bool shared = ReaperTableInUse() == ReaperTable::kShared;
  const size_t inbox = shared ? kMaxInboxWaitingShared : kMaxInboxWaiting;
  EXPECT_LE(ReaperThreadsForTesting(), kMaxReaperThreads);
  EXPECT_LE(ReaperPendingForTesting(), inbox);
  EXPECT_LE(ReaperKeptForTesting(), kMaxKeptOpen);
  EXPECT_LE(max_fds, fds_before + static_cast<int>(kMaxKeptOpen + (shared ? inbox + 1 : 0)) + 1);
  // The threads come back: everything goes, and opens are tried again.
  Release();
  const auto drained = Clock::now();
  while ((!ReaperTakesMore() || ReaperPendingForTesting() > 0 || ReaperKeptForTesting() > 0) &&
         ElapsedMs(drained) < kBoundMs) {
    usleep(1000);
  }
  EXPECT_EQ(ReaperKeptForTesting(), 0u);
  EXPECT_EQ(ReaperPendingForTesting(), 0u);
  EXPECT_EQ(FetchChunks(squatter.request, client).status, FetchStatus::kUnauthentic);
  EXPECT_TRUE(ReaperTakesMore());
  SetDisposalHookForTesting(nullptr);
}

// What is handed over straight to the reaper (not through a fetch, which
// refuses first) while every thread is stuck and the inbox is full: kept open
// in the host's table, never closed on this thread, and offered to the
// inbox again once the threads come back.
TEST(ReaperWedged, PastAFullInboxWhatIsHandedOverIsKeptOpenNotClosedHere) {
  SetDisposalHookForTesting(HoldEveryDisposal);
  // Until the inbox is full: kMaxInboxWaiting, or kMaxInboxWaitingShared
  // where the threads run in the host's table.
  size_t inbox = 0;
  for (size_t i = 0; i < kMaxInboxWaiting; ++i) {
    testing::SocketPair pair = testing::SeqpacketPair();
    CloseInBackground(std::move(pair.b));
    if (ReaperPendingForTesting() == inbox) break;  // kept: full
    inbox = ReaperPendingForTesting();
  }
  {
    std::unique_lock lock(g_mutex);
    ASSERT_TRUE(g_changed.wait_for(lock, std::chrono::milliseconds(kBoundMs),
                                   [] { return g_holding == kMaxReaperThreads; }));
  }
  const bool shared = ReaperTableInUse() == ReaperTable::kShared;
  ASSERT_EQ(inbox, shared ? kMaxInboxWaitingShared : kMaxInboxWaiting);
  EXPECT_FALSE(ReaperTakesMore());
  // A lingering socket, handed over last: its close here would wait kLingerS.
  ScopedFd keep_listener, keep_server;
  ScopedFd lingering = testing::LingeringSocket(kLingerS, &keep_listener, &keep_server);
  const int fds_before = testing::RestingFdCount();
  // Ten more, whose peers the test keeps: a close here shows as a hang-up.
  constexpr int kMore = 10;
  std::vector<ScopedFd> peers;
  for (int i = 0; i < kMore; ++i) {
    testing::SocketPair pair = testing::SeqpacketPair();
    CloseInBackground(std::move(pair.b));
    peers.push_back(std::move(pair.a));
  }
  int hung_up = 0;
  for (const ScopedFd& peer : peers) {
    pollfd p{peer.get(), POLLIN, 0};
    if (poll(&p, 1, 0) == 1) ++hung_up;
  }
  const auto start = Clock::now();
  CloseInBackground(std::move(lingering));
  const long handed_ms = ElapsedMs(start);
  const int fds_kept = FdCount();
  std::printf(
      "bound: %zu fds waiting in the inbox (at most %zu), %zu kept open in the host's table (at "
      "most %zu before the importer and listener refuse); %d of %d hung up (closed here); host "
      "fds %d -> %d; the lingering hand-over took %ld ms\n",
      ReaperPendingForTesting(), kMaxInboxWaiting, ReaperKeptForTesting(), kMaxKeptOpen, hung_up,
      kMore, fds_before, fds_kept, handed_ms);
  EXPECT_EQ(hung_up, 0) << "closed on the caller's thread";
  EXPECT_LT(handed_ms, 100);
  EXPECT_EQ(ReaperKeptForTesting(), static_cast<size_t>(kMore + 1) + (shared ? 1 : 0));
  // The ten kept and their peers; the lingering one was open already.
  EXPECT_EQ(fds_kept, fds_before + 2 * kMore);
  Release();
  const auto drained = Clock::now();
  while ((ReaperKeptForTesting() > 0 || ReaperPendingForTesting() > 0) &&
         ElapsedMs(drained) < kBoundMs) {
    (void)ReaperTakesMore();  // offers the kept ones again
    usleep(1000);
  }
  EXPECT_EQ(ReaperKeptForTesting(), 0u);
  EXPECT_EQ(ReaperPendingForTesting(), 0u);
  for (const ScopedFd& peer : peers) {
    pollfd p{peer.get(), POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, kBoundMs), 1) << "a kept fd was never closed";
  }
  EXPECT_TRUE(ReaperTakesMore());
  SetDisposalHookForTesting(nullptr);
}

}  // namespace
}  // namespace vmmipc::transport
