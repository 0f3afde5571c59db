// ServeConnection on one socketpair, without a listener: how long a peer may
// hold the exporter's one serving thread. A peer of another uid gets a short
// grace, not the full timeout (regression test: any local user could stall
// every export by connecting and staying silent, timeout_ms per connection).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "lingering_socket.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/serve_connection.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;

const SipKey kSecret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};
constexpr uint32_t kPid = 4242;

long ServeMs(ScopedFd server, uint32_t served_uid, int timeout_ms, int* handler_calls) {
  ServeHandler handler = [handler_calls](const ServeRequest&) {
    ++*handler_calls;
    ServeReply reply;
    reply.refuse = RefuseReason::kNotExported;
    reply.detail = "test";
    return reply;
  };
  ServeContext context;
  context.secret = kSecret;
  context.uid = served_uid;
  context.timeout = Timeout::Ms(timeout_ms);
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
  request.handle.exporter_pid = kPid;
  const auto bytes = wire::EncodeRequest(request, wire::KeyFor(kSecret, request.handle));
  ASSERT_TRUE(SendMessage(p.client.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  int calls = 0;
  ServeMs(std::move(p.server), geteuid() + 1, 5000, &calls);
  EXPECT_EQ(ReplyStatus(p.client.get()), static_cast<int>(RefuseReason::kWrongUser));
  EXPECT_EQ(calls, 0);  // even with a valid MAC
}

using testing::LingeringSocket;

// A request of pid kPid, with a valid MAC, carrying `fd`.
void SendRequestWithFd(int sock, int fd) {
  wire::Request request;
  request.handle.exporter_pid = kPid;
  const auto bytes = wire::EncodeRequest(request, wire::KeyFor(kSecret, request.handle));
  const int fds[] = {fd};
  ASSERT_TRUE(SendMessage(sock, bytes, fds, Deadline::AfterMs(1000)).ok());
}

// Regression (issue 12, item 1): the listener received a peer's fds before
// the uid check and closed them itself at the end: a lingering socket froze
// it for the linger time. Now no fd of the request is ever taken.
TEST_F(TransportServeConnection, AnotherUidsLingeringFdNeverBlocksTheServingThread) {
  Pair p;
  ScopedFd keep_listener, keep_server;
  {
    ScopedFd lingering = LingeringSocket(5, &keep_listener, &keep_server);
    SendRequestWithFd(p.client.get(), lingering.get());
  }  // our copy closes at once: the one in flight still holds the socket
  int calls = 0;
  EXPECT_LT(ServeMs(std::move(p.server), geteuid() + 1, 5000, &calls), 1000);
  EXPECT_EQ(calls, 0);
}

TEST_F(TransportServeConnection, OurUidsRequestCarryingALingeringFdIsRefusedWithoutBlocking) {
  Pair p;
  ScopedFd keep_listener, keep_server;
  {
    ScopedFd lingering = LingeringSocket(5, &keep_listener, &keep_server);
    SendRequestWithFd(p.client.get(), lingering.get());
  }
  int calls = 0;
  EXPECT_LT(ServeMs(std::move(p.server), geteuid(), 5000, &calls), 1000);
  EXPECT_EQ(calls, 0);
}

// Regression (issue 12, item 2): closing any fd of a file drops the
// process's POSIX locks on it, so an exporter that installed and closed a
// peer's fd of the host's lock file silently unlocked it.
TEST_F(TransportServeConnection, APeersFdOfTheHostsLockFileLeavesTheHostsLockInPlace) {
  char path[] = "/tmp/vmmipc-lock-XXXXXX";
  ScopedFd host(mkstemp(path));
  ASSERT_TRUE(host.valid());
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(host.get(), F_SETLK, &lock), 0);
  Pair p;
  // The peer is another process (a close of its own fd in this process
  // would drop the lock by itself).
  const pid_t peer = fork();
  if (peer == 0) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    wire::Request request;
    request.handle.exporter_pid = kPid;
    const auto bytes = wire::EncodeRequest(request, wire::KeyFor(kSecret, request.handle));
    const int fds[] = {fd};
    _exit(fd >= 0 && SendMessage(p.client.get(), bytes, fds, Deadline::AfterMs(1000)).ok() ? 0 : 1);
  }
  int peer_status = 0;
  ASSERT_EQ(waitpid(peer, &peer_status, 0), peer);
  ASSERT_TRUE(WIFEXITED(peer_status) && WEXITSTATUS(peer_status) == 0);
  int calls = 0;
  ServeMs(std::move(p.server), geteuid() + 1, 5000, &calls);
  p.client.Reset();
  for (int i = 0; i < 1000 && ReaperPendingForTesting() > 0; ++i) usleep(1000);
  // Another process sees whether the lock is still held.
  const pid_t child = fork();
  if (child == 0) {
    const int fd = open(path, O_RDWR);
    struct flock probe {};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    _exit(fd >= 0 && fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type == F_WRLCK ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the host's lock was dropped";
  unlink(path);
}

// Regression (issue 12, item 5): another uid flooded the exporter's log, one
// warning line per connection (520,000 lines in 5 s). Refusals and drops are
// now logged at most 20 times in 10 s, the rest counted for one summary line.
TEST_F(TransportServeConnection, RefusalLinesAreRateLimited) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("vmmipc-ratelimit-" + std::to_string(getpid()) + ".log"))
                               .string();
  std::filesystem::remove(path);
  log::SetFile(path);
  log::SetLevel(log::Level::kWarn);
  int calls = 0;
  for (int i = 0; i < 200; ++i) {
    Pair p;
    const char garbage[40] = "not a vmmipc request, just bytes";
    ASSERT_EQ(send(p.client.get(), garbage, sizeof(garbage), MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(garbage)));
    ServeMs(std::move(p.server), geteuid(), 100, &calls);
  }
  EXPECT_EQ(calls, 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  size_t lines = 0;
  for (size_t at = text.str().find("not a vmmipc request"); at != std::string::npos;
       at = text.str().find("not a vmmipc request", at + 1))
    ++lines;
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 20u) << text.str().substr(0, 2000);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace vmmipc::transport
