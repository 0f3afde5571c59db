// The reaper and the disposal of a peer's fds: a lingering TCP socket, alone
// or queued in Unix sockets (nested, behind empty messages, in a listening
// socket's backlog), is reset rather than waited for; the host's POSIX locks
// survive the disposal of a queued fd of the locked file; a disposal that does
// not return holds up neither the next ones nor the host's fd table.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "lingering_socket.h"
#include "test_process.h"
#include "transport/reaper/fd_disposal.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;
using vmmipc::testing::ElapsedMs;
using vmmipc::testing::FdCount;
using vmmipc::testing::kThreadSanitizer;
using vmmipc::testing::LingeringSocket;
using vmmipc::testing::SeqpacketPair;

constexpr int kLingerS = 30;  // what a close of the old kind would wait
constexpr int kBoundMs = 5000;

void SendFds(int socket, const std::vector<int>& fds, size_t bytes = 1) {
  std::vector<char> data(bytes, 'x');
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ASSERT_EQ(sendmsg(socket, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes)) << strerror(errno);
}

// A lingering socket with the ends that keep it lingering.
struct Lingering {
  ScopedFd client, listener, server;
  Lingering() { client = LingeringSocket(kLingerS, &listener, &server); }
  // Whether the server end saw a reset within the bound. It never reads: the
  // client's unsent data stays unsent, so a lingering close neither sends its
  // FIN nor returns before kLingerS; only an abortive close ends it sooner.
  bool ServerSeesAReset() const {
    pollfd p{server.get(), POLLRDHUP, 0};
    return poll(&p, 1, kBoundMs) == 1 && (p.revents & POLLERR) != 0;
  }
};

TEST(FdDisposal, ALingeringSocketIsResetNotWaitedFor) {
  Lingering lingering;
  DisposalCounts counts;
  const auto start = Clock::now();
  DisposeOfPeerFd(lingering.client.Release(), &counts);
  EXPECT_LT(ElapsedMs(start), kBoundMs);
  EXPECT_EQ(counts.closed, 1u);
  EXPECT_EQ(counts.sockets_defused, 1u);
  EXPECT_TRUE(lingering.ServerSeesAReset());
}

TEST(FdDisposal, AUnixQueueIsTakenApartBehindEmptyMessagesAndNestedFourDeep) {
  Lingering lingering;
  // level 0 queues level 1, which queues ... level 3, which queues the TCP
  // socket behind zero-length messages (a read of 0 bytes is not the end).
  std::vector<testing::SocketPair> levels;
  for (int i = 0; i < 4; ++i) levels.push_back(SeqpacketPair());
  for (int i = 0; i < 3; ++i) SendFds(levels[3].a.get(), {}, 0);
  SendFds(levels[3].a.get(), {lingering.client.get()});
  lingering.client.Reset();
  for (int i = 2; i >= 0; --i) {
    SendFds(levels[i].a.get(), {levels[i + 1].b.get()});
    levels[i + 1].b.Reset();
    levels[i + 1].a.Reset();
  }
  DisposalCounts counts;
  const auto start = Clock::now();
  DisposeOfPeerFd(levels[0].b.Release(), &counts);
  EXPECT_LT(ElapsedMs(start), kBoundMs);
  EXPECT_EQ(counts.closed, 5u);  // four Unix sockets and the TCP one
  EXPECT_EQ(counts.queues_left, 0u);
  EXPECT_TRUE(lingering.ServerSeesAReset());
}

TEST(FdDisposal, AListeningSocketsUnacceptedConnectionsAreTakenApart) {
  Lingering lingering;
  ScopedFd listening(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = "vmmipc-disposal-test." + std::to_string(getpid());
  memcpy(address.sun_path + 1, name.data(), name.size());
  const socklen_t length = offsetof(sockaddr_un, sun_path) + 1 + name.size();
  ASSERT_EQ(bind(listening.get(), reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listening.get(), 4), 0);
  ScopedFd client(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&address), length), 0);
  SendFds(client.get(), {lingering.client.get()});
  lingering.client.Reset();
  client.Reset();
  DisposalCounts counts;
  DisposeOfPeerFd(listening.Release(), &counts);
  EXPECT_EQ(counts.closed, 3u);  // the listener, the connection, the TCP socket
  EXPECT_TRUE(lingering.ServerSeesAReset());
}

TEST(FdDisposal, AFileIsClosedAndAPipeToo) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  ScopedFd keep(pipe_fds[1]);
  DisposalCounts counts;
  DisposeOfPeerFd(pipe_fds[0], &counts);
  DisposeOfPeerFd(open("/dev/null", O_RDONLY | O_CLOEXEC), &counts);
  EXPECT_EQ(counts.closed, 2u);
  EXPECT_EQ(counts.sockets_defused, 0u);
  EXPECT_EQ(fcntl(pipe_fds[0], F_GETFD), -1);
}

// The reaper runs in a private fd table where the kernel allows it (5.9+
// with pidfd_getfd); ThreadSanitizer builds use the host's table.
bool PrivateTable() {
  if (kThreadSanitizer) return false;
  // Start it if needed: a socket with nothing queued.
  testing::SocketPair pair = SeqpacketPair();
  CloseInBackground(std::move(pair.b));
  for (int i = 0; i < 2000 && ReaperTableInUse() == ReaperTable::kNotStarted; ++i) usleep(1000);
  for (int i = 0; i < 2000 && ReaperPendingForTesting() > 0; ++i) usleep(1000);
  // Once the threads hold their own copy of the inbox, the next hand-over
  // closes the host's: done here, so that tests count only their own fds.
  testing::SocketPair another = SeqpacketPair();
  CloseInBackground(std::move(another.b));
  for (int i = 0; i < 2000 && ReaperPendingForTesting() > 0; ++i) usleep(1000);
  return ReaperTableInUse() == ReaperTable::kPrivate;
}

bool WaitForNoPending() {
  const auto start = Clock::now();
  while (ReaperPendingForTesting() > 0) {
    if (ElapsedMs(start) > kBoundMs) return false;
    usleep(1000);
  }
  return true;
}

TEST(FdReaper, AConnectionQueuingALingeringSocketIsResetPromptly) {
  if (!PrivateTable()) GTEST_SKIP() << "the reaper runs in the host's table here";
  Lingering lingering;
  testing::SocketPair pair = SeqpacketPair();
  SendFds(pair.a.get(), {lingering.client.get()});
  lingering.client.Reset();
  pair.a.Reset();
  const int fds_before = FdCount();
  const auto start = Clock::now();
  CloseInBackground(std::move(pair.b));
  EXPECT_LT(ElapsedMs(start), 100);  // the caller never waits
  EXPECT_EQ(FdCount(), fds_before - 1);
  EXPECT_TRUE(lingering.ServerSeesAReset());
  EXPECT_TRUE(WaitForNoPending());
}

bool HeldByAnotherProcess(const std::string& path) {
  const pid_t child = fork();
  if (child == 0) {
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    struct flock query {};
    query.l_type = F_WRLCK;
    query.l_whence = SEEK_SET;
    const bool held = fd >= 0 && fcntl(fd, F_GETLK, &query) == 0 && query.l_type != F_UNLCK;
    _exit(held ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(FdReaper, TheHostsLockOnAFileSurvivesTheDisposalOfAQueuedFdOfIt) {
  if (!PrivateTable()) GTEST_SKIP() << "the reaper runs in the host's table here";
  char path[] = "/tmp/vmmipc-reaper-lock-XXXXXX";
  ScopedFd locked(mkostemp(path, O_CLOEXEC));
  ASSERT_TRUE(locked.valid());
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  ASSERT_EQ(fcntl(locked.get(), F_SETLK, &lock), 0);
  ASSERT_TRUE(HeldByAnotherProcess(path));
  // A peer's connection queues an fd of the locked file (opened by the peer:
  // any close of one here would drop the lock): taking it out of the queue
  // installs it; its close in the host's table would drop the lock.
  testing::SocketPair pair = SeqpacketPair();
  const pid_t peer = fork();
  if (peer == 0) {
    const int fd = open(path, O_RDWR | O_CLOEXEC);
    SendFds(pair.a.get(), {fd});
    _exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(peer, &status, 0), peer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  pair.a.Reset();
  CloseInBackground(std::move(pair.b));
  ASSERT_TRUE(WaitForNoPending());
  EXPECT_TRUE(HeldByAnotherProcess(path));
  unlink(path);
}

// The hold point: disposals of the socket whose inode is g_held_inode wait
// until released.
std::mutex g_hold_mutex;
std::condition_variable g_hold_changed;
ino_t g_held_inode = 0;
int g_holding = 0;

void HoldMarked(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return;
  std::unique_lock lock(g_hold_mutex);
  if (g_held_inode == 0 || st.st_ino != g_held_inode) return;
  ++g_holding;
  g_hold_changed.notify_all();
  g_hold_changed.wait(lock, [] { return g_held_inode == 0; });
  --g_holding;
}

TEST(FdReaper, ADisposalThatDoesNotReturnHoldsUpNeitherTheNextNorTheHostsFds) {
  if (!PrivateTable()) GTEST_SKIP() << "the reaper runs in the host's table here";
  SetDisposalHookForTesting(HoldMarked);
  // Four stuck disposals: every thread the cap allows.
  std::vector<testing::SocketPair> stuck;
  for (int i = 0; i < 4; ++i) stuck.push_back(SeqpacketPair());
  struct stat st {};
  ASSERT_EQ(fstat(stuck[0].b.get(), &st), 0);
  {
    std::lock_guard lock(g_hold_mutex);
    g_held_inode = st.st_ino;
  }
  // The first one's inode is marked; the others are held by marking theirs in turn.
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(fstat(stuck[i].b.get(), &st), 0);
    {
      std::lock_guard lock(g_hold_mutex);
      g_held_inode = st.st_ino;
    }
    CloseInBackground(std::move(stuck[i].b));
    std::unique_lock lock(g_hold_mutex);
    ASSERT_TRUE(g_hold_changed.wait_for(lock, std::chrono::milliseconds(kBoundMs),
                                        [i] { return g_holding == i + 1; }))
        << "disposal " << i << " never started: the next waits for a stuck one";
  }
  EXPECT_LE(ReaperThreadsForTesting(), 4u);
  // Past the cap, what is handed over waits in the inbox's queue, not in the
  // host's fd table.
  const int fds_before = FdCount();
  for (int i = 0; i < 50; ++i) {
    testing::SocketPair pair = SeqpacketPair();
    CloseInBackground(std::move(pair.b));
  }
  EXPECT_EQ(FdCount(), fds_before);
  EXPECT_EQ(ReaperPendingForTesting(), 54u);
  {
    std::lock_guard lock(g_hold_mutex);
    g_held_inode = 0;
  }
  g_hold_changed.notify_all();
  EXPECT_TRUE(WaitForNoPending());
  SetDisposalHookForTesting(nullptr);
}

TEST(FdReaper, InTheHostsTableAStuckCloseHoldsUpNothingElse) {
  // The path of kernels without pidfd_getfd or CLOSE_RANGE_UNSHARE: closes in
  // the host's table, several threads.
  if (ReaperTableInUse() != ReaperTable::kNotStarted) GTEST_SKIP() << "started by another test";
  UseSharedTableForTesting();
  Lingering lingering;
  const auto start = Clock::now();
  CloseInBackground(std::move(lingering.client));  // this thread's close waits kLingerS
  EXPECT_LT(ElapsedMs(start), 100);
  for (int i = 0; i < 2000 && ReaperTableInUse() == ReaperTable::kNotStarted; ++i) usleep(1000);
  EXPECT_EQ(ReaperTableInUse(), ReaperTable::kShared);
  // Another fd is closed while that close waits.
  testing::SocketPair pair = SeqpacketPair();
  CloseInBackground(std::move(pair.b));
  char byte;
  pollfd p{pair.a.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, kBoundMs), 1);
  EXPECT_EQ(recv(pair.a.get(), &byte, 1, MSG_DONTWAIT), 0);  // its peer closed
  // The count goes down just after the close its peer saw: wait for it.
  const auto counted = Clock::now();
  while (ReaperPendingForTesting() > 1 && ElapsedMs(counted) < kBoundMs) usleep(1000);
  EXPECT_EQ(ReaperPendingForTesting(), 1u);  // the lingering one
}

}  // namespace
}  // namespace vmmipc::transport
