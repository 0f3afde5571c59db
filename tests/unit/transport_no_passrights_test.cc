// The listener on a kernel without SO_PASSRIGHTS (before 6.16: Ubuntu 22.04
// and 24.04 hosts), where every fd a peer sends is accepted into the
// connection's queue. This binary is linked with -Wl,--wrap=setsockopt
// (tests/CMakeLists.txt): the wrapper refuses SO_PASSRIGHTS as such a kernel
// does, so the path runs on any kernel. A peer that sends one lingering TCP
// socket and then 1,100 connections, each with an fd attached, must cost the
// exporter neither its fd table nor a legitimate open.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "lingering_socket.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace {
std::atomic<int> g_passrights_refused{0};
}  // namespace

extern "C" int __real_setsockopt(int fd, int level, int name, const void* value, socklen_t length);
extern "C" int __wrap_setsockopt(int fd, int level, int name, const void* value, socklen_t length) {
  if (level == SOL_SOCKET && name == 83) {  // SO_PASSRIGHTS
    ++g_passrights_refused;
    errno = ENOPROTOOPT;  // what a kernel before 6.16 answers
    return -1;
  }
  return __real_setsockopt(fd, level, name, value, length);
}

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;
using vmmipc::testing::ElapsedMs;
using vmmipc::testing::FdCount;

const SipKey kSecret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};
constexpr uint64_t kBase = 0x7f1200000000ULL;
constexpr uint64_t kChunk = 4096;
constexpr int kConnections = 1100;
// What the flood may cost the host at most, in fds: the connections the
// listener holds while it reads their (bogus) requests, and a few of its own.
constexpr int kFdBudget = 96;

FetchRequest Request(uint32_t pid) {
  FetchRequest r;
  r.handle.exporter_pid = pid;
  r.handle.address = kBase;
  r.handle.chunk_base = kBase;
  r.handle.chunk_size = kChunk;
  r.handle.region_base = kBase;
  r.handle.generation = 7;
  r.capability = wire::Capability(kSecret, r.handle);
  return r;
}

// The attacker, in a child process: one connection carries a TCP socket
// whose last close lingers 60 s, then kConnections more each carry an fd of
// /dev/null; each is closed by the attacker at once. Then it reports on
// `report` whether the lingering socket's other end saw its connection end
// within 5 s (it would after 60 s if the exporter's close waited),
// by a reset.
int Flood(const SocketAddress& address, int report) {
  rlimit limit{8192, 8192};
  setrlimit(RLIMIT_NOFILE, &limit);
  ScopedFd keep_listener, keep_server;
  ScopedFd lingering = vmmipc::testing::LingeringSocket(60, &keep_listener, &keep_server);
  ScopedFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const uint8_t junk[16] = {};
  for (int i = 0; i <= kConnections; ++i) {
    ScopedFd sock;
    if (!ConnectSeqpacket(address, Deadline::AfterMs(5000), &sock).ok()) return 2;
    const int fds[1] = {i == 0 ? lingering.get() : null_fd.get()};
    if (!SendMessage(sock.get(), junk, fds, Deadline::AfterMs(5000)).ok()) {
      return 3;
    }
    if (i == 0) lingering.Reset();  // the exporter's copy is the last
  }
  // Never read: a lingering close waits for the unsent data, a reset does not.
  pollfd p{keep_server.get(), POLLRDHUP, 0};
  const bool ended = poll(&p, 1, 5000) == 1 && (p.revents & POLLERR) != 0;
  const char verdict = ended ? 'y' : 'n';
  return write(report, &verdict, 1) == 1 ? 0 : 4;
}

TEST(TransportNoPassRights, AFloodOfConnectionsWithFdsCostsTheExporterNeitherFdsNorOpens) {
  if (vmmipc::testing::kThreadSanitizer) {
    GTEST_SKIP() << "the reaper runs in the host's table under ThreadSanitizer: lingering sockets "
                    "are closed as they are, not reset";
  }
  const uint32_t pid = 0x10000000u + (static_cast<uint32_t>(getpid()) << 6);
  ListenerOptions options;
  options.secret = kSecret;
  options.pid = pid;
  options.timeout = Timeout::Ms(1000);
  ServeHandler handler = [](const ServeRequest&) {
    ServeReply reply;
    ChunkGrant grant;
    grant.address = kBase;
    grant.size = kChunk;
    grant.generation = 7;
    grant.fd.Reset(memfd_create("no-passrights-test", MFD_CLOEXEC));
    ftruncate(grant.fd.get(), kChunk);
    reply.chunks.push_back(std::move(grant));
    return reply;
  };
  std::string error;
  auto listener = Listener::Start(options, handler, &error);
  ASSERT_NE(listener, nullptr) << error;
  ASSERT_GE(g_passrights_refused.load(), 1) << "the listener did not ask for SO_PASSRIGHTS";
  SocketAddress address;
  ASSERT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(pid), "", &address, &error)) << error;
  // The reaper's inbox (one fd for the process's life) exists before the count.
  {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
    ScopedFd keep(pair[0]);
    CloseInBackground(ScopedFd(pair[1]));
    for (int i = 0; i < 2000 && ReaperPendingForTesting() > 0; ++i) usleep(1000);
    CloseInBackground(ScopedFd(dup(pair[0])));  // the host's copy of the other end goes
    for (int i = 0; i < 2000 && ReaperPendingForTesting() > 0; ++i) usleep(1000);
  }
  // At rest: the listener's first measurements and the reaper's start may
  // still hold an fd a moment on a loaded machine (12 against 11, 1 of 40).
  const auto quiet = [] { return ReaperPendingForTesting() == 0; };
  const int fds_before = vmmipc::testing::RestingFdCount(quiet);

  int report[2];
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  const pid_t attacker = fork();
  if (attacker == 0) _exit(Flood(address, report[1]));
  close(report[1]);
  // Meanwhile the host's own work goes on: its fd count stays within the
  // budget, its open() works, and a legitimate fetch is answered.
  int most = 0, opens_failed = 0, fetches = 0, fetches_failed = 0;
  pollfd done{report[0], POLLIN, 0};
  while (poll(&done, 1, 0) == 0) {
    most = std::max(most, FdCount());
    ScopedFd own(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!own) ++opens_failed;
    if (fetches < 50) {
      ClientOptions client;
      client.timeout = Timeout::Ms(2000);
      FetchResult result = FetchChunks(Request(pid), client);
      ++fetches;
      if (result.status != FetchStatus::kOk) ++fetches_failed;
    }
  }
  char verdict = 0;
  ASSERT_EQ(read(report[0], &verdict, 1), 1);
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(attacker, &status, 0), attacker);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the attacker could not deliver its flood";
  std::printf("fds: %d before, at most %d during the flood; %d fetches\n", fds_before, most,
              fetches);
  EXPECT_EQ(verdict, 'y') << "the lingering socket's close waited (60 s) instead of resetting";
  EXPECT_LE(most, fds_before + kFdBudget) << "the flood took the exporter's fd table";
  EXPECT_EQ(opens_failed, 0);
  EXPECT_GT(fetches, 0);
  EXPECT_EQ(fetches_failed, 0);
  // Everything the flood left is disposed of: back to where it started,
  // counted at rest (the listener drops the attacker's last connections at
  // their deadline).
  const auto start = Clock::now();
  int fds_after = vmmipc::testing::RestingFdCount(quiet);
  while (fds_after != fds_before && ElapsedMs(start) < 5000) {
    usleep(1000);
    fds_after = vmmipc::testing::RestingFdCount(quiet);
  }
  std::printf("fds at rest: %d before, %d after\n", fds_before, fds_after);
  EXPECT_EQ(fds_after, fds_before);
  EXPECT_EQ(ReaperPendingForTesting(), 0u);
}

}  // namespace
}  // namespace vmmipc::transport
