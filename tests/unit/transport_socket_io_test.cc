// socket_io over real sockets: memfds passed with SCM_RIGHTS arrive CLOEXEC
// and share the memory, waits end at the deadline or the stop fd, a full
// backlog times out, and fds the kernel could not install are reported.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "test_process.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {
namespace {

using Clock = std::chrono::steady_clock;

using vmmipc::testing::ElapsedMs;
using vmmipc::testing::FdCount;

ScopedFd Memfd(const std::string& content) {
  ScopedFd fd(memfd_create("transport-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(pwrite(fd.get(), content.data(), content.size(), 0),
            static_cast<ssize_t>(content.size()));
  return fd;
}

std::string ReadAt(int fd, size_t size) {
  std::string s(size, '\0');
  EXPECT_EQ(pread(fd, s.data(), size, 0), static_cast<ssize_t>(size));
  return s;
}

using vmmipc::testing::SeqpacketPair;
using vmmipc::testing::SocketPair;

TEST(TransportSocketIo, MemfdTravelsAndSharesMemory) {
  const int before = FdCount();
  {
    SocketPair p = SeqpacketPair();
    ScopedFd memfd = Memfd("written by the sender");
    const uint8_t data[3] = {1, 2, 3};
    const int fds[1] = {memfd.get()};
    ASSERT_TRUE(SendMessage(p.a.get(), data, fds, Deadline::AfterMs(1000)).ok());

    uint8_t buffer[16];
    ReceivedMessage m;
    ASSERT_TRUE(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(1000)).ok());
    EXPECT_EQ(m.length, 3u);
    EXPECT_FALSE(m.truncated);
    EXPECT_FALSE(m.control_truncated);
    ASSERT_EQ(m.fds.size(), 1u);
    EXPECT_NE(m.fds[0].get(), memfd.get());
    EXPECT_TRUE(fcntl(m.fds[0].get(), F_GETFD) & FD_CLOEXEC);
    EXPECT_EQ(ReadAt(m.fds[0].get(), 21), "written by the sender");

    // Same memory: a store through a mapping of the received fd shows up in
    // the sender's.
    void* mine = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, memfd.get(), 0);
    void* theirs = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m.fds[0].get(), 0);
    ASSERT_NE(mine, MAP_FAILED);
    ASSERT_NE(theirs, MAP_FAILED);
    std::memcpy(theirs, "through the copy", 16);
    EXPECT_EQ(std::memcmp(mine, "through the copy", 16), 0);
    munmap(mine, 4096);
    munmap(theirs, 4096);
  }
  EXPECT_EQ(FdCount(), before);
}

TEST(TransportSocketIo, MaxFdsInOneMessage) {
  const int before = FdCount();
  {
    SocketPair p = SeqpacketPair();
    ScopedFd memfd = Memfd("x");
    std::vector<int> fds(kMaxFdsPerMessage, memfd.get());
    const uint8_t data[1] = {0};
    ASSERT_TRUE(SendMessage(p.a.get(), data, fds, Deadline::AfterMs(1000)).ok());
    uint8_t buffer[4];
    ReceivedMessage m;
    ASSERT_TRUE(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(1000)).ok());
    EXPECT_EQ(m.fds.size(), kMaxFdsPerMessage);
    EXPECT_FALSE(m.control_truncated);

    fds.push_back(memfd.get());
    EXPECT_EQ(SendMessage(p.a.get(), data, fds, Deadline::AfterMs(1000)).status, IoStatus::kError);
  }
  EXPECT_EQ(FdCount(), before);
}

TEST(TransportSocketIo, LongMessageIsMarkedTruncated) {
  SocketPair p = SeqpacketPair();
  const uint8_t data[10] = {};
  ASSERT_TRUE(SendMessage(p.a.get(), data, {}, Deadline::AfterMs(1000)).ok());
  uint8_t buffer[4];
  ReceivedMessage m;
  ASSERT_TRUE(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(1000)).ok());
  EXPECT_TRUE(m.truncated);
  EXPECT_EQ(m.length, 4u);
}

TEST(TransportSocketIo, ReceiveTimesOut) {
  SocketPair p = SeqpacketPair();
  uint8_t buffer[4];
  ReceivedMessage m;
  const auto start = Clock::now();
  EXPECT_EQ(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(100)).status,
            IoStatus::kTimeout);
  const long ms = ElapsedMs(start);
  EXPECT_GE(ms, 95);
  EXPECT_LT(ms, 600);
}

TEST(TransportSocketIo, StopFdEndsTheWait) {
  SocketPair p = SeqpacketPair();
  ScopedFd stop(eventfd(1, EFD_CLOEXEC));
  uint8_t buffer[4];
  ReceivedMessage m;
  const auto start = Clock::now();
  EXPECT_EQ(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(5000), stop.get()).status,
            IoStatus::kStopped);
  EXPECT_LT(ElapsedMs(start), 500);
}

TEST(TransportSocketIo, PeerCloseIsReported) {
  SocketPair p = SeqpacketPair();
  p.a.Reset();
  uint8_t buffer[4];
  ReceivedMessage m;
  EXPECT_EQ(ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(1000)).status,
            IoStatus::kPeerClosed);
  const uint8_t data[1] = {0};
  EXPECT_EQ(SendMessage(p.b.get(), data, {}, Deadline::AfterMs(1000)).status,
            IoStatus::kPeerClosed);  // EPIPE, and no SIGPIPE
}

TEST(TransportSocketIo, SendTimesOutWhenPeerDoesNotRead) {
  SocketPair p = SeqpacketPair();
  const std::vector<uint8_t> data(4096, 0);
  const auto start = Clock::now();
  IoResult r;
  for (int i = 0; i < 100000 && r.ok(); ++i)
    r = SendMessage(p.a.get(), data, {}, Deadline::AfterMs(100));
  EXPECT_EQ(r.status, IoStatus::kTimeout);
  EXPECT_LT(ElapsedMs(start), 2000);
}

TEST(TransportSocketIo, PeerCredentialsAreOurs) {
  SocketPair p = SeqpacketPair();
  PeerCredentials c;
  ASSERT_TRUE(GetPeerCredentials(p.a.get(), &c).ok());
  EXPECT_EQ(c.pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(c.uid, geteuid());
  EXPECT_EQ(c.gid, getegid());
}

TEST(TransportSocketIo, ConnectToNobody) {
  const int before = FdCount();
  SocketAddress abstract_address;
  std::string error;
  ASSERT_TRUE(
      MakeSocketAddress(geteuid(), SocketOwner::Pid(0x7ffffff0u), "", &abstract_address, &error));
  ScopedFd fd;
  IoResult r = ConnectSeqpacket(abstract_address, Deadline::AfterMs(200), &fd);
  EXPECT_EQ(r.status, IoStatus::kError);
  EXPECT_EQ(r.error, ECONNREFUSED);
  SocketAddress path_address;
  // Named only: MakeSocketAddress would refuse the missing directory before any connect.
  ASSERT_TRUE(NameSocketAddress(geteuid(), SocketOwner::Pid(0x7ffffff0u), "/nonexistent-dir",
                                &path_address, &error));
  r = ConnectSeqpacket(path_address, Deadline::AfterMs(200), &fd);
  EXPECT_EQ(r.status, IoStatus::kError);
  EXPECT_EQ(r.error, ENOENT);
  EXPECT_FALSE(fd.valid());
  EXPECT_EQ(FdCount(), before);
}

TEST(TransportSocketIo, FullBacklogTimesOut) {
  SocketAddress address;
  std::string error;
  ASSERT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(0x7ffffff1u), "", &address, &error));
  ScopedFd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(listener.get(), address.get(), address.length), 0) << strerror(errno);
  ASSERT_EQ(listen(listener.get(), 0), 0);  // never accepted: the queue fills at once
  std::vector<ScopedFd> connected;
  const auto start = Clock::now();
  IoResult r;
  for (int i = 0; i < 16 && r.ok(); ++i) {
    ScopedFd fd;
    r = ConnectSeqpacket(address, Deadline::AfterMs(150), &fd);
    if (r.ok()) connected.push_back(std::move(fd));
  }
  EXPECT_EQ(r.status, IoStatus::kTimeout);
  EXPECT_GE(connected.size(), 1u);
  EXPECT_LT(ElapsedMs(start), 1500);
}

TEST(TransportSocketIo, FdsTheKernelCannotInstallAreReported) {
  // In a child, since it lowers RLIMIT_NOFILE below what a batch needs.
  SocketPair p = SeqpacketPair();
  ScopedFd memfd = Memfd("x");
  const std::vector<int> fds(16, memfd.get());
  const uint8_t data[1] = {0};
  ASSERT_TRUE(SendMessage(p.a.get(), data, fds, Deadline::AfterMs(1000)).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Leave exactly two free descriptors: fill the table up to a low limit,
    // then free two.
    rlimit limit{64, 64};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(10);
    std::vector<int> fillers;
    for (int fd; (fd = dup(0)) >= 0;) fillers.push_back(fd);
    if (errno != EMFILE || fillers.size() < 2) _exit(14);
    close(fillers.back());
    fillers.pop_back();
    close(fillers.back());
    fillers.pop_back();
    uint8_t buffer[4];
    ReceivedMessage m;
    if (!ReceiveMessage(p.b.get(), buffer, &m, Deadline::AfterMs(1000)).ok()) _exit(11);
    if (!m.control_truncated) _exit(12);
    if (m.fds.size() != 2) _exit(13);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace vmmipc::transport
