// Warm connections (transport/client/warm_connections.h, the listener's kept
// connections): consecutive fetches reuse one connection; the pool's bounds;
// a kept connection its exporter hung up on, or that holds something unasked,
// is given up and the fetch connects afresh; an exporter that closes a kept
// connection under a request is asked again on a new one; a restarted
// exporter on the same name refuses cleanly; a peer that queues requests
// without reading loses its connection and never holds up the listener; one
// peer process keeps at most kMaxKeptPerPeer; a forked child closes its
// copies and leaves its parent's connections working.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <thread>

#include "listener_test_support.h"
#include "transport/client/warm_connections.h"
#include "transport/serve/fd_budget.h"
#include "transport/socket_io.h"

namespace vmmipc::transport::listener_test {
namespace {

using vmmipc::testing::RestingFdCount;
using vmmipc::testing::SeqpacketPair;

class TransportWarm : public TransportListener {
 protected:
  void SetUp() override {
    CloseWarmConnections();
    fds_at_rest_ = OwnFdsAtRest();
  }
  void TearDown() override { CloseWarmConnections(); }
  // This process's fds at rest (every other thread asleep, nothing waiting
  // for the reaper, the same count twice), less the reaper's inbox.
  static int OwnFdsAtRest() {
    const int fds = RestingFdCount([] { return ReaperPendingForTesting() == 0; });
    return fds - static_cast<int>(ReaperHostFdsForTesting());
  }
  void ExpectNoFdLeak() { EXPECT_EQ(OwnFdsAtRest(), fds_at_rest_) << "file descriptors leaked"; }
  int fds_at_rest_ = 0;
};

ClientOptions WarmClient(size_t limit = 64, int timeout_ms = 2000) {
  ClientOptions c = Client(timeout_ms);
  c.warm_connections = limit;
  return c;
}

// True when the exporter's side of `fd` hung up (read what is queued first).
bool HungUp(int fd, int wait_ms) {
  uint8_t buffer[wire::kMaxReplySize];
  const auto until = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    // Whatever is queued (replies, their fds) is taken and dropped here.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{buffer, sizeof(buffer)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN) return true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      const int* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) close(fds[i]);
    }
  }
  return false;
}

// A genuine request for Request(pid)'s handle, as the importer encodes it.
std::array<uint8_t, wire::kRequestSize> GenuineRequestBytes(uint32_t pid) {
  wire::Request r;
  r.handle = Request(pid).handle;
  for (size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<uint8_t>(i + 1);
  return wire::EncodeRequest(r, GenuineKey(pid));
}

TEST_F(TransportWarm, ConsecutiveFetchesReuseOneConnection) {
  const uint32_t pid = FakePid();
  std::atomic<int> calls{0};
  auto listener = MustStart(Options(pid, 2000), ChunksHandler(1, &calls));
  const WarmConnectionStats before = WarmConnectionStatsNow();
  for (int i = 0; i < 20; ++i) {
    FetchResult r = FetchChunks(Request(pid), WarmClient());
    ASSERT_EQ(r.status, FetchStatus::kOk) << r.detail;
    EXPECT_EQ(r.warm, i > 0) << "fetch " << i;
    ASSERT_EQ(r.chunks.size(), 1u);
    EXPECT_EQ(TagOf(r.chunks[0].fd.get()), 1000u);
  }
  const WarmConnectionStats after = WarmConnectionStatsNow();
  EXPECT_EQ(after.reused - before.reused, 19u);
  EXPECT_EQ(after.kept, 1u);
  EXPECT_EQ(calls.load(), 20);
  CloseWarmConnections();
  listener.reset();
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, OffMeansANewConnectionPerFetch) {
  const uint32_t pid = FakePid();
  auto listener = MustStart(Options(pid, 2000), ChunksHandler(1));
  for (int i = 0; i < 5; ++i) {
    FetchResult r = FetchChunks(Request(pid), WarmClient(0));
    ASSERT_EQ(r.status, FetchStatus::kOk) << r.detail;
    EXPECT_FALSE(r.warm);
  }
  EXPECT_EQ(WarmConnectionStatsNow().kept, 0u);
  listener.reset();
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, PoolBoundsPerExporterAndInAll) {
  std::vector<ScopedFd> peers;
  auto keep = [&](const std::string& name, size_t limit) {
    auto [ours, theirs] = SeqpacketPair();
    peers.push_back(std::move(theirs));
    KeepWarmConnection(name, std::move(ours), limit);
  };
  const size_t evicted = WarmConnectionStatsNow().evicted;
  for (size_t i = 0; i < kWarmPerExporter + 2; ++i) keep("@a", 64);
  EXPECT_EQ(WarmConnectionStatsNow().kept, kWarmPerExporter);
  EXPECT_EQ(WarmConnectionStatsNow().evicted - evicted, 2u);
  keep("@b", 64);
  keep("@c", kWarmPerExporter + 1);  // in all: the least recently used (the first "@a") goes
  EXPECT_EQ(WarmConnectionStatsNow().kept, kWarmPerExporter + 1);
  keep("@d", 0);  // 0: nothing is kept
  EXPECT_EQ(WarmConnectionStatsNow().kept, kWarmPerExporter + 1);
  EXPECT_TRUE(TakeWarmConnection("@b").valid());
  EXPECT_FALSE(TakeWarmConnection("@b").valid());
  EXPECT_FALSE(TakeWarmConnection("@nobody").valid());
  CloseWarmConnections();
  EXPECT_EQ(WarmConnectionStatsNow().kept, 0u);
  peers.clear();
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, AHungUpOrBusyConnectionIsGivenUpNotReused) {
  auto [hung, hung_peer] = SeqpacketPair();
  KeepWarmConnection("@x", std::move(hung), 64);
  hung_peer.Reset();  // the exporter closed its side
  auto [busy, busy_peer] = SeqpacketPair();
  KeepWarmConnection("@x", std::move(busy), 64);
  // Something nobody asked for, with an fd: a hostile or broken exporter.
  ScopedFd memfd = Memfd(5);
  const int fds[] = {memfd.get()};
  const uint8_t byte = 1;
  ASSERT_TRUE(SendMessage(busy_peer.get(), {&byte, 1}, fds, Deadline::AfterMs(100)).ok());
  const size_t discarded = WarmConnectionStatsNow().discarded;
  EXPECT_FALSE(TakeWarmConnection("@x").valid());
  EXPECT_EQ(WarmConnectionStatsNow().discarded - discarded, 2u);
  EXPECT_EQ(WarmConnectionStatsNow().kept, 0u);
  busy_peer.Reset();
  memfd.Reset();
  ExpectNoFdLeak();
}

// A raw exporter on `pid`'s name: answers the first request of its first
// connection, then closes that connection under the second request without
// answering; its second connection is answered. The importer's second fetch
// finds its kept connection fit (nothing queued yet), sends, reads EOF, and
// asks again on a new connection, within the same deadline.
TEST_F(TransportWarm, AConnectionClosedUnderTheRequestIsAskedAgainOnANewOne) {
  const uint32_t pid = FakePid();
  const SocketAddress address = AbstractAddress(pid);
  ScopedFd listen_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(listen_fd.get(), address.get(), address.length), 0);
  ASSERT_EQ(listen(listen_fd.get(), 8), 0);
  ScopedFd chunk = Memfd(77);
  auto answer = [&](int fd) {
    uint8_t buffer[512];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return false;
    wire::RequestPreamble preamble;
    if (wire::ParseRequestPreamble({buffer, static_cast<size_t>(n)}, &preamble) !=
        wire::WireError::kOk)
      return false;
    wire::ReplyHeader h;
    h.total_chunks = 1;
    h.batch_count = 1;
    const wire::ReplyEntry entry{kBase, kChunk, 7};
    const auto bytes = wire::EncodeReply(preamble.nonce, GenuineKey(pid), h, {&entry, 1});
    const int fds[] = {chunk.get()};
    return SendMessage(fd, bytes, fds, Deadline::AfterMs(1000)).ok();
  };
  std::thread exporter([&] {
    ScopedFd first(accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    answer(first.get());
    uint8_t buffer[512];
    (void)recv(first.get(), buffer, sizeof(buffer), 0);  // the second request: not answered
    first.Reset();
    ScopedFd second(accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    answer(second.get());
  });
  FetchResult a = FetchChunks(Request(pid), WarmClient());
  ASSERT_EQ(a.status, FetchStatus::kOk) << a.detail;
  FetchResult b = FetchChunks(Request(pid), WarmClient());
  exporter.join();
  ASSERT_EQ(b.status, FetchStatus::kOk) << b.detail;
  EXPECT_FALSE(b.warm) << "answered on the new connection";
  ASSERT_EQ(b.chunks.size(), 1u);
  EXPECT_EQ(TagOf(b.chunks[0].fd.get()), 77u);
  a.chunks.clear();
  b.chunks.clear();
  CloseWarmConnections();
  listen_fd.Reset();
  chunk.Reset();
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, ARestartedExporterOnTheSameNameRefusesCleanly) {
  const uint32_t pid = FakePid();
  auto first = MustStart(Options(pid, 2000), ChunksHandler(1));
  ASSERT_EQ(FetchChunks(Request(pid), WarmClient()).status, FetchStatus::kOk);
  ASSERT_EQ(WarmConnectionStatsNow().kept, 1u);
  first.reset();  // the exporter is gone; its name is free again
  ListenerOptions other = Options(pid, 2000);
  other.secret = SipKey{0x1111, 0x2222};  // a new process: another secret
  auto second = MustStart(other, ChunksHandler(1));
  const size_t discarded = WarmConnectionStatsNow().discarded;
  FetchResult stale = FetchChunks(Request(pid), WarmClient());
  EXPECT_EQ(stale.status, FetchStatus::kRefused) << stale.detail;
  EXPECT_EQ(stale.refuse, RefuseReason::kBadToken);
  EXPECT_FALSE(stale.warm);
  EXPECT_EQ(WarmConnectionStatsNow().discarded - discarded, 1u);
  // The new exporter's own handle is served (on a new connection, kept then).
  FetchRequest fresh = Request(pid);
  fresh.capability = wire::Capability(other.secret, fresh.handle);
  FetchResult ok = FetchChunks(fresh, WarmClient());
  EXPECT_EQ(ok.status, FetchStatus::kOk) << ok.detail;
  ok.chunks.clear();
  CloseWarmConnections();
  second.reset();
  ExpectNoFdLeak();
}

// A same-uid peer that pipelines requests on its kept connection and reads no
// reply: the listener answers while the socket takes the replies, then closes
// the connection rather than wait (its sends on kept connections never wait);
// meanwhile an importer's fetch is answered long before the listener's own
// timeout would have passed had its thread waited on the peer.
TEST_F(TransportWarm, APeerThatStopsReadingLosesItsConnectionAndHoldsUpNobody) {
  const uint32_t pid = FakePid();
  auto listener = MustStart(Options(pid, 20000), ChunksHandler(1));
  const SocketAddress address = AbstractAddress(pid);
  ScopedFd raw;
  ASSERT_TRUE(ConnectSeqpacket(address, Deadline::AfterMs(1000), &raw).ok());
  const auto request = GenuineRequestBytes(pid);
  // Requests until the listener hangs up (EPIPE), each send waiting for room
  // as the listener reads: bounded by the count and by one 10 s deadline.
  const Deadline bound = Deadline::AfterMs(10000);
  int sent = 0;
  IoResult io;
  for (; sent < 100000 && !bound.Expired(); ++sent) {
    io = SendMessage(raw.get(), request, {}, bound);
    if (!io.ok()) break;
  }
  EXPECT_EQ(io.status, IoStatus::kPeerClosed) << "the listener kept a peer that reads nothing";
  const auto start = Clock::now();
  FetchResult r = FetchChunks(Request(pid), WarmClient(64, 5000));
  const long fetch_ms = ElapsedMs(start);
  EXPECT_EQ(r.status, FetchStatus::kOk) << r.detail;
  EXPECT_LT(fetch_ms, 5000);
  EXPECT_TRUE(HungUp(raw.get(), 10000)) << "no end of stream after the queued replies";
  std::printf(
      "[ bound    ] the listener closed a peer that sent %d requests and read no reply; "
      "another importer's fetch: %ld ms (the listener's timeout: 20000 ms)\n",
      sent, fetch_ms);
  r.chunks.clear();
  raw.Reset();
  CloseWarmConnections();
  listener.reset();
  ExpectNoFdLeak();
}

// A long reply on a kept connection (issue 44): an importer asks for an
// 8,500-chunk run (34 batches) on a connection the listener kept after an
// earlier reply, then is descheduled for 1.5 s before it reads. The worker
// that sends it waits for room as it would on a new connection, within the
// listener's timeout: the reply's deadline, not the kept connection's (before,
// a request on a kept connection carried a 0 ms send deadline to the worker,
// and the open failed at the batch that found the socket full).
TEST_F(TransportWarm, ALongReplyOnAKeptConnectionWaitsForAStalledImporter) {
  constexpr size_t kChunks = 8500;
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  const rlimit before = nofile;
  // The reply's fds (the exporter's 8,500, the importer's batch) and the
  // kernel's count of fds in flight (bounded by RLIMIT_NOFILE) need room.
  constexpr rlim_t kNeeded = 2 * kChunks;
  if (nofile.rlim_cur < kNeeded) nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, kNeeded);
  if (nofile.rlim_cur < kNeeded) GTEST_SKIP() << "RLIMIT_NOFILE's hard limit is below 17000";
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &nofile), 0);
  {
    const uint32_t pid = FakePid();
    std::atomic<int> calls{0};
    auto listener = MustStart(Options(pid, 5000), ByAddress(kChunks, &calls));
    // A short reply first: the listener keeps the connection after it.
    RawImporter importer = SendRawRequest(pid, kBase + 16, 0x11);
    ASSERT_EQ(importer.ReadReply(2000), 0);
    // The long request on the kept connection (a fresh nonce), then a stall.
    importer.request.handle.address = kLongReplyAddress;
    importer.request.nonce.fill(0x22);
    const auto bytes =
        wire::EncodeRequest(importer.request, wire::KeyFor(kSecret, importer.request.handle));
    ASSERT_TRUE(SendMessage(importer.fd.get(), bytes, {}, Deadline::AfterMs(1000)).ok())
        << "the listener did not keep the connection";
    usleep(1500 * 1000);  // the importer descheduled: the stall under test, not a wait for an event
    const auto start = Clock::now();
    const int status = importer.ReadReply(5000);
    std::printf(
        "[ bound    ] %zu chunks on a kept connection after a 1.5 s stall: status %d, "
        "read in %ld ms\n",
        kChunks, status, ElapsedMs(start));
    EXPECT_EQ(status, 0) << "the long reply on the kept connection failed";
    EXPECT_EQ(calls.load(), 2);
    importer.fd.Reset();
    listener.reset();
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, OnePeerProcessKeepsAtMostItsShare) {
  const uint32_t pid = FakePid();
  auto listener = MustStart(Options(pid, 2000), ChunksHandler(1));
  const SocketAddress address = AbstractAddress(pid);
  const auto request = GenuineRequestBytes(pid);
  constexpr size_t kConnections = kMaxKeptPerPeer + 6;
  std::vector<ScopedFd> raw(kConnections);
  for (ScopedFd& c : raw) {
    ASSERT_TRUE(ConnectSeqpacket(address, Deadline::AfterMs(1000), &c).ok());
    ASSERT_TRUE(SendMessage(c.get(), request, {}, Deadline::AfterMs(1000)).ok());
    ASSERT_TRUE(WaitFor(c.get(), POLLIN, Deadline::AfterMs(2000)).ok());
  }
  size_t hung_up = 0;
  for (ScopedFd& c : raw) hung_up += HungUp(c.get(), 300) ? 1 : 0;
  EXPECT_EQ(hung_up, kConnections - kMaxKeptPerPeer);
  std::printf("[ bound    ] %zu connections of one process answered, %zu kept (kMaxKeptPerPeer)\n",
              kConnections, kConnections - hung_up);
  raw.clear();
  listener.reset();
  ExpectNoFdLeak();
}

// A fork while a fetch uses a warm connection (issue 44): the connection is
// out of the pool then, on the fetch's thread, which does not exist in the
// child. The child closes its copy too (before, it kept it until exec or
// exit); the parent's fetch is answered on it all the same.
TEST_F(TransportWarm, AForkedChildClosesTheConnectionAFetchIsUsing) {
  const uint32_t pid = FakePid();
  std::atomic<int> calls{0};
  std::atomic<bool> release{false};
  ServeHandler chunk = ChunksHandler(1);
  // The second request's handler holds the fetch on its warm connection
  // until the fork is done (a hold point, released below).
  auto listener = MustStart(Options(pid, 5000), [&](const ServeRequest& r) {
    if (++calls == 2)
      for (int i = 0; i < 5000 && !release.load(); ++i) usleep(1000);
    return chunk(r);
  });
  ASSERT_EQ(FetchChunks(Request(pid), WarmClient()).status, FetchStatus::kOk);
  const std::string name = AbstractAddress(pid).display;
  ScopedFd taken = TakeWarmConnection(name);
  ASSERT_TRUE(taken.valid());
  const int in_use_fd = taken.get();
  KeepWarmConnection(name, std::move(taken), 64);
  FetchResult held;
  std::thread fetch([&] { held = FetchChunks(Request(pid), WarmClient(64, 5000)); });
  for (int i = 0; i < 5000 && calls.load() < 2; ++i) usleep(1000);
  ASSERT_EQ(calls.load(), 2) << "the fetch never reached the exporter";
  ASSERT_EQ(WarmConnectionStatsNow().kept, 0u) << "the fetch did not take the warm connection";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    WarmConnectionsAfterForkInChild();
    _exit(fcntl(in_use_fd, F_GETFD) != -1 || errno != EBADF ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  release = true;
  fetch.join();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child kept its copy of the connection in use";
  EXPECT_EQ(held.status, FetchStatus::kOk) << held.detail;
  EXPECT_TRUE(held.warm);
  held.chunks.clear();
  CloseWarmConnections();
  listener.reset();
  ExpectNoFdLeak();
}

TEST_F(TransportWarm, AForkedChildClosesItsCopiesAndLeavesTheParentsWorking) {
  const uint32_t pid = FakePid();
  auto listener = MustStart(Options(pid, 2000), ChunksHandler(1));
  ASSERT_EQ(FetchChunks(Request(pid), WarmClient()).status, FetchStatus::kOk);
  ASSERT_EQ(WarmConnectionStatsNow().kept, 1u);
  // The kept connection's fd number, to look for it in the child.
  const std::string name = AbstractAddress(pid).display;
  ScopedFd taken = TakeWarmConnection(name);
  ASSERT_TRUE(taken.valid());
  const int kept_fd = taken.get();
  KeepWarmConnection(name, std::move(taken), 64);
  // The fork handlers' Prepare and Parent halves are left to core's
  // pthread_atfork handlers where an earlier test of this binary registered
  // them (calling them here too would take the pool's lock twice); the
  // child's half runs here either way (a second run finds the pool empty).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    WarmConnectionsAfterForkInChild();
    int code = 0;
    if (WarmConnectionStatsNow().kept != 0) code |= 1;
    if (fcntl(kept_fd, F_GETFD) != -1 || errno != EBADF) code |= 2;  // its copy, closed
    // The child's own fetch: a new connection of its own.
    FetchResult r = FetchChunks(Request(pid), WarmClient());
    if (r.status != FetchStatus::kOk || r.warm) code |= 4;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: pool not emptied, 2: copy not closed, 4: fetch";
  // The parent's kept connection still works: the child's close was not a shutdown.
  FetchResult again = FetchChunks(Request(pid), WarmClient());
  EXPECT_EQ(again.status, FetchStatus::kOk) << again.detail;
  EXPECT_TRUE(again.warm);
  again.chunks.clear();
  CloseWarmConnections();
  listener.reset();
  ExpectNoFdLeak();
}

}  // namespace
}  // namespace vmmipc::transport::listener_test
