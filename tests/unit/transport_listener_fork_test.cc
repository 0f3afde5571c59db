// What a forked child of a serving process does with the listener's
// connections it inherits (issue 36 item 6): one waiting for its request,
// one kept for its importer's next request, one queued with its reply for a
// busy worker. The child closes its copies of all of them, and of the queued
// reply's chunk fds, so that the importer sees EOF when the parent closes
// its end, and the child pins none of the exported memory. The worker is
// held busy by a hold point; the child's fds are looked at by number.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "listener_test_support.h"

namespace vmmipc::transport {
namespace {

using namespace listener_test;  // NOLINT(build/namespaces): the shared helpers

constexpr size_t kQueuedChunks = 300;  // two messages: a worker sends it

// This process's sockets whose own address is `address` (the listening
// socket and every connection it accepted: they share its name).
std::vector<int> SocketsNamed(const SocketAddress& address) {
  std::vector<int> fds;
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_un name{};
    socklen_t length = sizeof(name);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&name), &length) != 0) continue;
    if (length == address.length && std::memcmp(&name, &address.sockaddr, length) == 0)
      fds.push_back(fd);
  }
  return fds;
}

// This process's fds of the chunks ChunksHandler makes (memfds of its name).
std::vector<int> ChunkFds() {
  std::vector<int> fds;
  for (int fd = 0; fd < 4096; ++fd) {
    char target[256] = {};
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    if (readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
    if (std::strstr(target, "memfd:transport-listener-test") != nullptr) fds.push_back(fd);
  }
  return fds;
}

// Whether the peer of `fd` hung up within `ms` (what is queued read first).
bool SeesEof(int fd, int ms) {
  const Deadline deadline = Deadline::AfterMs(ms);
  while (!deadline.Expired()) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, deadline.RemainingMs()) <= 0) return false;
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return errno == ECONNRESET;
  }
  return false;
}

// A forked child with the fork handlers core runs around a fork
// (core/process_state.cc): the listener's PrepareFork before, its
// ParentAfterFork in the parent, its AbandonAfterFork in the child. The
// child writes how many of `inherited` are still open in it after that,
// then waits for EOF on `stay` (its copy of the write end, `stay_write`,
// closed) before it exits.
pid_t ForkAndAbandon(Listener* listener, const std::vector<int>& inherited, int report, int stay,
                     int stay_write) {
  listener->PrepareFork();
  const pid_t child = fork();
  if (child != 0) {
    listener->ParentAfterFork();
    return child;
  }
  log::ResetAfterFork();
  alarm(30);
  close(stay_write);
  listener->AbandonAfterFork();
  int open = 0;
  for (const int fd : inherited) open += fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
  (void)!write(report, &open, sizeof(open));
  char byte;
  (void)!read(stay, &byte, 1);
  _exit(0);
}

class TransportListenerFork : public TransportListener {
 protected:
  // The body: a listener with a waiting, a kept and a queued connection
  // forks; the child's fds, then the importers' EOFs, are checked.
  void ForkWithEveryKindOfConnection(const ListenerOptions& options, std::atomic<int>* calls);
};

// Before, a forked child kept its copies of the listener's waiting and kept
// connections and of the queued replies (connection and chunk fds) until it
// exited: the importers did not see EOF when the parent closed its end, and
// the child pinned the exported memory. Now it closes every one of them,
// and the parent serves on.
TEST_F(TransportListenerFork, AForkedChildClosesTheConnectionsAndRepliesItInherits) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a child forked beside running threads may hang in the sanitizer's allocator";
#endif
  const uint32_t pid = FakePid();
  ListenerOptions options = Options(pid, 5000);
  options.max_workers = 1;
  std::atomic<int> calls{0};
  ForkWithEveryKindOfConnection(options, &calls);
  ExpectNoFdLeak();
}

void TransportListenerFork::ForkWithEveryKindOfConnection(const ListenerOptions& options,
                                                          std::atomic<int>* calls) {
  const uint32_t pid = options.pid;
  auto listener = MustStart(options, ByAddress(kQueuedChunks, calls));
  ASSERT_NE(listener, nullptr);
  const SocketAddress address = AbstractAddress(pid);
  std::shared_ptr<WorkerHold> hold = HoldTheWorker(listener.get());
  ASSERT_NE(hold, nullptr) << "the worker never took the posted task";
  // Kept: a one-message reply read; the listener keeps the connection.
  const RawImporter kept = SendRawRequest(pid, kBase + 16, 1);
  ASSERT_EQ(kept.ReadReply(2000), 0);
  // Queued: a long reply, waiting for the busy worker.
  const RawImporter queued = SendRawRequest(pid, kLongReplyAddress, 2);
  // Waiting: connected, no request yet.
  ScopedFd waiting;
  ASSERT_TRUE(ConnectSeqpacket(address, Deadline::AfterMs(1000), &waiting).ok());
  // The listening socket and the three connections, and the queued chunks.
  std::vector<int> sockets;
  std::vector<int> chunks;
  for (const auto start = Clock::now(); ElapsedMs(start) < 5000; usleep(1000)) {
    sockets = SocketsNamed(address);
    chunks = ChunkFds();
    if (sockets.size() == 4 && chunks.size() == kQueuedChunks) break;
  }
  ASSERT_EQ(sockets.size(), 4u) << "the listener does not hold the three connections";
  ASSERT_EQ(chunks.size(), kQueuedChunks) << "the long reply is not queued";
  std::vector<int> inherited = sockets;
  inherited.insert(inherited.end(), chunks.begin(), chunks.end());

  int report[2];
  int stay[2];
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(stay, O_CLOEXEC), 0);
  const ScopedFd report_read(report[0]), report_write(report[1]);
  ScopedFd stay_read(stay[0]), stay_write(stay[1]);
  const pid_t child = ForkAndAbandon(listener.get(), inherited, report[1], stay[0], stay[1]);
  ASSERT_GT(child, 0);
  int still_open = -1;
  pollfd reported{report[0], POLLIN, 0};
  if (poll(&reported, 1, 5000) == 1) (void)!read(report[0], &still_open, sizeof(still_open));
  std::printf(
      "the forked child holds %d of the %zu fds it inherited from the listener (its socket, a "
      "waiting, a kept and a queued connection, the queued reply's %zu chunks)\n",
      still_open, inherited.size(), kQueuedChunks);
  EXPECT_EQ(still_open, 0);

  // The child lives on; the parent serves on, and its closes reach the importers.
  EXPECT_EQ(FetchChunks(Request(pid), Client(2000)).status, FetchStatus::kOk);
  hold->Release();
  EXPECT_EQ(queued.ReadReply(5000), 0);
  EXPECT_TRUE(SeesEof(queued.fd.get(), 2000)) << "the queued reply's connection stayed open";
  listener.reset();  // closes the waiting and kept connections
  EXPECT_TRUE(SeesEof(waiting.get(), 2000)) << "the waiting connection stayed open";
  EXPECT_TRUE(SeesEof(kept.fd.get(), 2000)) << "the kept connection stayed open";
  stay_write.Reset();
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace vmmipc::transport
