// A SOCK_SEQPACKET recvmsg that reports EOF while a message is queued: the
// kernel looks at the queue (empty), the peer queues its last message and
// shuts down, the kernel then sees the shutdown and returns 0. The window is a
// few instructions wide; it was hit once in ~25,000 opens with 8 processes on
// one H200 (the exporter answers, then closes its end). This binary is linked
// with -Wl,--wrap=recvmsg (tests/CMakeLists.txt) so that a test can put the
// peer's send and shutdown inside that window on demand: the wrapped call
// lets the peer act (or waits until it has) and then returns 0, as the kernel
// does. Its own binary so that no other test's recvmsg is wrapped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

extern "C" ssize_t __real_recvmsg(int fd, msghdr* msg, int flags);

namespace {

// Armed for one call on the arming thread: other threads (a listener's) are
// never touched.
thread_local bool t_race_next = false;
thread_local std::function<void(int fd)> t_peer_acts;  // the peer's send + shutdown
std::atomic<int> g_races{0};

// Waits until the peer of `fd` has shut down (or 2 s passed).
void WaitForPeerShutdown(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  for (int i = 0; i < 200 && (p.revents & (POLLRDHUP | POLLHUP)) == 0; ++i) {
    p.revents = 0;
    ::poll(&p, 1, 10);
  }
}

}  // namespace

extern "C" ssize_t __wrap_recvmsg(int fd, msghdr* msg, int flags) {
  if (!t_race_next) return __real_recvmsg(fd, msg, flags);
  t_race_next = false;
  // The kernel's first look found the queue empty; now the peer acts...
  if (t_peer_acts) t_peer_acts(fd);
  WaitForPeerShutdown(fd);
  // ...and the kernel, seeing the shutdown, reports the end.
  ++g_races;
  msg->msg_flags = 0;
  msg->msg_controllen = 0;
  return 0;
}

namespace vmmipc::transport {
namespace {

using vmmipc::testing::SeqpacketPair;
using vmmipc::testing::SocketPair;

ScopedFd Memfd() {
  ScopedFd fd(memfd_create("transport-eof-race-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  return fd;
}

// Arms the race: the next recvmsg of this thread sees `sender` send `data`
// with `fd` (if valid) and shut down inside the kernel's window.
void ArmRace(int sender, std::string data, int fd) {
  t_race_next = true;
  t_peer_acts = [sender, data, fd](int) {
    const int fds[1] = {fd};
    ASSERT_TRUE(SendMessage(sender,
                            std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()),
                            fd >= 0 ? std::span<const int>(fds) : std::span<const int>(),
                            Deadline::AfterMs(1000))
                    .ok());
    ::shutdown(sender, SHUT_RDWR);
  };
}

TEST(TransportEofRace, PeekSeesTheMessageQueuedBeforeTheShutdown) {
  SocketPair p = SeqpacketPair();
  ScopedFd memfd = Memfd();
  const int races = g_races;
  ArmRace(p.a.get(), "answer", memfd.get());
  uint8_t buffer[64];
  PeekedMessage peeked;
  const IoResult io = PeekMessage(p.b.get(), buffer, &peeked, Deadline::AfterMs(1000));
  EXPECT_EQ(g_races, races + 1) << "the race was not staged";
  ASSERT_EQ(io.status, IoStatus::kOk) << IoStatusName(io.status);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), peeked.length), "answer");
  EXPECT_TRUE(peeked.carries_fds);
  // Taking it for real gives the fd; after it, the end is the end.
  ReceivedMessage received;
  ASSERT_TRUE(ReceiveMessage(p.b.get(), buffer, &received, Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(received.fds.size(), 1u);
  EXPECT_EQ(ReceiveMessage(p.b.get(), buffer, &received, Deadline::AfterMs(1000)).status,
            IoStatus::kPeerClosed);
}

TEST(TransportEofRace, ReceiveSeesTheMessageQueuedBeforeTheShutdown) {
  SocketPair p = SeqpacketPair();
  ScopedFd memfd = Memfd();
  const int races = g_races;
  ArmRace(p.a.get(), "answer", memfd.get());
  uint8_t buffer[64];
  ReceivedMessage received;
  const IoResult io = ReceiveMessage(p.b.get(), buffer, &received, Deadline::AfterMs(1000));
  EXPECT_EQ(g_races, races + 1) << "the race was not staged";
  ASSERT_EQ(io.status, IoStatus::kOk) << IoStatusName(io.status);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), received.length), "answer");
  EXPECT_EQ(received.fds.size(), 1u);
}

TEST(TransportEofRace, AnEndWithNothingQueuedIsStillTheEndAtOnce) {
  SocketPair p = SeqpacketPair();
  ArmRace(p.a.get(), "", -1);
  t_peer_acts = [&p](int) { ::shutdown(p.a.get(), SHUT_RDWR); };  // shuts down, sends nothing
  uint8_t buffer[64];
  PeekedMessage peeked;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(PeekMessage(p.b.get(), buffer, &peeked, Deadline::AfterMs(5000)).status,
            IoStatus::kPeerClosed);
  ReceivedMessage received;
  EXPECT_EQ(ReceiveMessage(p.b.get(), buffer, &received, Deadline::AfterMs(5000)).status,
            IoStatus::kPeerClosed);
  // Bounded test, not a timing benchmark: the second look must not wait for the deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// The whole exchange: a real Listener answers and closes; the importer's first
// look at the reply falls in the window. Before the second look this open
// failed with kProtocolError ("the exporter closed the connection").
TEST(TransportEofRace, FetchGetsTheAnswerOfAnExporterThatClosedRightAfterIt) {
  const SipKey secret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};
  constexpr uint64_t kBase = 0x7f1200000000ULL;
  const uint32_t pid = 0x30000000u + (static_cast<uint32_t>(getpid()) << 4);
  ListenerOptions options;
  options.secret = secret;
  options.pid = pid;
  options.timeout = Timeout::Ms(2000);
  ScopedFd memfd = Memfd();
  ASSERT_EQ(ftruncate(memfd.get(), 4096), 0);
  std::string error;
  auto listener = Listener::Start(
      options,
      [&memfd](const ServeRequest&) {
        ServeReply reply;
        ChunkGrant grant;
        grant.address = kBase;
        grant.size = 4096;
        grant.generation = 7;
        grant.fd = ScopedFd(fcntl(memfd.get(), F_DUPFD_CLOEXEC, 0));
        reply.chunks.push_back(std::move(grant));
        return reply;
      },
      &error);
  ASSERT_NE(listener, nullptr) << error;
  FetchRequest request;
  request.handle.exporter_pid = pid;
  request.handle.address = kBase + 16;
  request.handle.chunk_base = kBase;
  request.handle.chunk_size = 4096;
  request.handle.region_base = kBase;
  request.handle.generation = 7;
  request.capability = wire::Capability(secret, request.handle);
  const int races = g_races;
  t_race_next = true;     // the importer's first recvmsg: its look at the reply
  t_peer_acts = nullptr;  // the listener answers and closes on its own thread
  ClientOptions client;
  client.timeout = Timeout::Ms(2000);
  const FetchResult result = FetchChunks(request, client);
  EXPECT_EQ(g_races, races + 1) << "the race was not staged";
  ASSERT_EQ(result.status, FetchStatus::kOk) << result.detail;
  ASSERT_EQ(result.chunks.size(), 1u);
  EXPECT_TRUE(result.chunks[0].fd.valid());
}

}  // namespace
}  // namespace vmmipc::transport
