// ServeConnection on one socketpair, without a listener: how long a peer may
// hold the exporter's one serving thread. A peer of another uid gets a short
// grace, not the full timeout (regression test: any local user could stall
// every export by connecting and staying silent, timeout_ms per connection).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "common/log.h"
#include "transport/fd_channel.h"
#include "transport/serve_connection.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kToken = 0x5eed5eed12345678ULL;
constexpr uint32_t kPid = 4242;

long ServeMs(ScopedFd server, uint32_t served_uid, int timeout_ms, int* handler_calls) {
  ServeHandler handler = [handler_calls](const ServeRequest&) {
    ++*handler_calls;
    return ServeReply{RefuseReason::kNotExported, "test", {}};
  };
  ServeContext context;
  context.key = wire::DeriveKey(kToken, kPid);
  context.uid = served_uid;
  context.timeout_ms = timeout_ms;
  context.handler = &handler;
  context.name = "@test";
  const auto start = Clock::now();
  ServeConnection(std::move(server), context);
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    client.Reset(fds[0]);
    server.Reset(fds[1]);
  }
  ScopedFd client, server;
};

// The status of the one reply on `fd`, or -1 when the connection just ended.
int ReplyStatus(int fd) {
  uint8_t buffer[wire::kMaxReplySize];
  ReceivedMessage m;
  if (!ReceiveMessage(fd, buffer, &m, Deadline::AfterMs(1000)).ok() || m.length < 8) return -1;
  return buffer[6] | (buffer[7] << 8);
}

class TransportServeConnection : public ::testing::Test {
 protected:
  void SetUp() override { log::SetLevel(log::Level::kOff); }
  void TearDown() override { log::SetLevel(log::Level::kWarn); }
};

TEST_F(TransportServeConnection, SilentPeerOfAnotherUidIsDroppedAfterAShortGrace) {
  Pair p;
  int calls = 0;
  // 5 s is the timeout our own importers get; another user gets a fraction of a second.
  EXPECT_LT(ServeMs(std::move(p.server), geteuid() + 1, 5000, &calls), 1000);
  EXPECT_EQ(ReplyStatus(p.client.get()), -1);
  EXPECT_EQ(calls, 0);
}

TEST_F(TransportServeConnection, SilentPeerOfOurUidMayTakeTheWholeTimeout) {
  Pair p;
  int calls = 0;
  EXPECT_GE(ServeMs(std::move(p.server), geteuid(), 300, &calls), 290);
  EXPECT_EQ(ReplyStatus(p.client.get()), -1);
  EXPECT_EQ(calls, 0);
}

TEST_F(TransportServeConnection, QueuedRequestOfAnotherUidStillGetsTheWrongUserRefusal) {
  Pair p;
  wire::Request request;
  request.exporter_pid = kPid;
  const auto bytes = wire::EncodeRequest(request, wire::DeriveKey(kToken, kPid));
  ASSERT_TRUE(SendMessage(p.client.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  int calls = 0;
  ServeMs(std::move(p.server), geteuid() + 1, 5000, &calls);
  EXPECT_EQ(ReplyStatus(p.client.get()), static_cast<int>(RefuseReason::kWrongUser));
  EXPECT_EQ(calls, 0);  // even with a valid MAC
}

}  // namespace
}  // namespace vmmipc::transport
