// transport/peer_fds: the kinds of fd an importer takes as device memory, and
// a same-uid exporter whose genuinely MAC'd grant carries a socket whose last
// close lingers: the open fails at once, and nothing waits for that close.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "lingering_socket.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/client/peer_fds.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

using vmmipc::testing::ElapsedMs;

bool Memory(int fd) {
  std::string why;
  const bool ok = IsMemoryFdKind(fd, &why);
  if (!ok) {
    EXPECT_FALSE(why.empty());
  }
  return ok;
}

TEST(PeerFds, MemoryKindsPassAndSocketsPipesDirectoriesTerminalsDoNot) {
  ScopedFd memfd(memfd_create("peer-fds-test", MFD_CLOEXEC));
  EXPECT_TRUE(Memory(memfd.get()));
  ScopedFd anon(eventfd(0, EFD_CLOEXEC));  // an anonymous inode, as a driver's export may be
  EXPECT_TRUE(Memory(anon.get()));
  ScopedFd null_device(open("/dev/null", O_RDWR | O_CLOEXEC));
  EXPECT_TRUE(Memory(null_device.get()));  // the driver's import refuses it later
  testing::SocketPair pair = testing::SeqpacketPair();
  EXPECT_FALSE(Memory(pair.a.get()));
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  ScopedFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  EXPECT_FALSE(Memory(read_end.get()));
  ScopedFd directory(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_FALSE(Memory(directory.get()));
  ScopedFd path_only(open("/dev/null", O_PATH | O_CLOEXEC));
  EXPECT_FALSE(Memory(path_only.get()));
  ScopedFd terminal(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (terminal.valid()) {
    EXPECT_FALSE(Memory(terminal.get()));
  }
}

// A regular file of a filesystem that is not memory (FUSE's, NFS's: their
// every close may flush and wait for ever) is no device memory; the stand-in
// here is a file of /proc, a regular file of a filesystem the test controls
// no more than a FUSE mount's, but whose kind is certain (issue 36 item 1).
TEST(PeerFds, ARegularFileOfAnotherFilesystemThanMemoryIsRefused) {
  ScopedFd proc_file(open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(proc_file.valid());
  std::string why;
  EXPECT_FALSE(IsMemoryFdKind(proc_file.get(), &why));
  EXPECT_NE(why.find("a regular file of a filesystem of type 0x9fa0, not memory"),
            std::string::npos)
      << why;
}

// What is refused and may wait on every close is not even handed to the
// reaper (the hand-over closes this table's copy, which would be the close
// that waits): it stays open, never closed here.
TEST(PeerFds, ARefusedFileWhoseEveryCloseMayWaitIsKeptOpenNotClosed) {
  std::vector<ScopedFd> fds;
  fds.emplace_back(open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fds[0].valid());
  const int number = fds[0].get();
  struct stat before {};
  ASSERT_EQ(fstat(number, &before), 0);
  const size_t kept = ReaperKeptForTesting();
  HandToReaper(&fds);
  EXPECT_TRUE(fds.empty());
  struct stat after {};
  ASSERT_EQ(fstat(number, &after), 0) << "closed on this thread";
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(ReaperKeptForTesting(), kept + 1);
  std::printf("bound: %zu fds kept open for the process's life (at most %zu with the overflow)\n",
              ReaperKeptForTesting(), kMaxKeptOpen);
}

// A fake exporter on fake pid `pid`'s name that grants, with a genuine MAC,
// one chunk whose fd is `fd`.
void GrantOnce(const SocketAddress& address, ScopedFd* listening, int fd, uint64_t capability) {
  ScopedFd connection(accept4(listening->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(connection.valid());
  uint8_t buffer[256];
  ReceivedMessage request;
  ASSERT_TRUE(ReceiveMessage(connection.get(), buffer, &request, Deadline::AfterMs(3000)).ok());
  wire::RequestPreamble preamble;
  ASSERT_EQ(wire::ParseRequestPreamble({buffer, request.length}, &preamble), wire::WireError::kOk);
  wire::ReplyHeader header;
  header.total_chunks = 1;
  header.batch_count = 1;
  const wire::ReplyEntry entry{0x7f1200000000ULL, 4096, 7};
  const SipKey key = wire::DeriveKey(capability, preamble.exporter_pid);
  const auto reply = wire::EncodeReply(preamble.nonce, key, header, {&entry, 1});
  const int fds[1] = {fd};
  ASSERT_TRUE(SendMessage(connection.get(), reply, fds, Deadline::AfterMs(3000)).ok());
  ReceivedMessage rest;  // until the client hangs up
  (void)ReceiveMessage(connection.get(), buffer, &rest, Deadline::AfterMs(3000));
  (void)address;
}

TEST(PeerFds, AGenuineGrantOfALingeringSocketFailsTheOpenAtOnce) {
  const uint32_t pid = 0x10000000u + (static_cast<uint32_t>(getpid()) << 6) + 1;
  const uint64_t capability = 0x1234567890abcdefULL;
  SocketAddress address;
  std::string error;
  ASSERT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(pid), "", &address, &error)) << error;
  ScopedFd listening(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_EQ(bind(listening.get(), address.get(), address.length), 0);
  ASSERT_EQ(listen(listening.get(), 1), 0);
  ScopedFd keep_listener, keep_server;
  ScopedFd lingering = testing::LingeringSocket(30, &keep_listener, &keep_server);
  std::thread exporter([&] { GrantOnce(address, &listening, lingering.get(), capability); });
  FetchRequest request;
  request.handle.exporter_pid = pid;
  request.capability = capability;
  request.handle.address = request.handle.chunk_base = request.handle.region_base =
      0x7f1200000000ULL;
  request.handle.chunk_size = 4096;
  request.handle.generation = 7;
  ClientOptions client;
  client.timeout = Timeout::Ms(2000);
  const auto start = std::chrono::steady_clock::now();
  const FetchResult result = FetchChunks(request, client);
  EXPECT_LT(ElapsedMs(start), 2000);
  EXPECT_EQ(result.status, FetchStatus::kProtocolError) << result.detail;
  EXPECT_NE(result.detail.find("a socket, not device memory"), std::string::npos) << result.detail;
  exporter.join();
  lingering.Reset();  // the exporter's copy: the reaper's is the last
  // Where the reaper takes fds apart (its own fd table), the socket is reset
  // rather than left to linger.
  if (ReaperTableInUse() == ReaperTable::kPrivate) {
    pollfd p{keep_server.get(), POLLRDHUP, 0};
    EXPECT_EQ(poll(&p, 1, 5000), 1);
    EXPECT_NE(p.revents & POLLERR, 0) << "not reset";
  }
}

}  // namespace
}  // namespace vmmipc::transport
