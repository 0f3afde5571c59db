// What a forked child of a serving process does with the listener's
// connections and replies it inherits (issue 36 item 6): one connection
// waiting for its request, one kept for its importer's next request, one
// queued with its reply for a busy worker, and a reply a worker is sending.
// The child closes its copies of all of them, and of the replies' chunk fds,
// so that it pins none of the exported memory, and the importers see EOF
// when the parent closes its end. The worker is held busy by a hold point (a
// task posted to it), or held inside a send by one in sendmsg; and a fork
// while the poll thread is inside the job queue's lock (starting the first
// worker: held in its pthread_sigmask) must wait for it. This binary is
// linked with -Wl,--wrap=sendmsg and --wrap=pthread_sigmask
// (tests/CMakeLists.txt). The child's fds are looked at by number.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "listener_test_support.h"

extern "C" ssize_t __real_sendmsg(int fd, const msghdr* msg, int flags);
extern "C" int __real_pthread_sigmask(int how, const sigset_t* set, sigset_t* old);

namespace vmmipc::transport {
namespace {

using namespace listener_test;  // NOLINT(build/namespaces): the shared helpers

constexpr size_t kQueuedChunks = 300;  // two messages: a worker sends it

// The hold point in sendmsg: armed for one message of a whole batch of fds
// (a long reply's first), on whichever thread sends it.
std::atomic<bool> g_hold_a_batch{false};
std::shared_ptr<WorkerHold> g_send_hold;

size_t FdsIn(const msghdr* msg) {
  size_t fds = 0;
  for (const cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(msg), const_cast<cmsghdr*>(c)))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      fds += (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
  return fds;
}

// The hold point in pthread_sigmask: armed for one call (a thread starting,
// StartQuietThread: the first worker, under the job queue's lock). The held
// thread stays there until the forking thread waits in a futex (the fork
// handler waiting for the queue's lock), or until told.
std::atomic<bool> g_hold_a_thread_start{false};
std::atomic<bool> g_starting_held{false};
std::atomic<bool> g_go_on{false};
std::atomic<pid_t> g_forker{0};

}  // namespace
}  // namespace vmmipc::transport

extern "C" ssize_t __wrap_sendmsg(int fd, const msghdr* msg, int flags) {
  using namespace vmmipc::transport;  // NOLINT(build/namespaces)
  if (FdsIn(msg) >= wire::kMaxChunksPerBatch && g_hold_a_batch.exchange(false))
    g_send_hold->Block();
  return __real_sendmsg(fd, msg, flags);
}

extern "C" int __wrap_pthread_sigmask(int how, const sigset_t* set, sigset_t* old) {
  using namespace vmmipc::transport;  // NOLINT(build/namespaces)
  if (g_hold_a_thread_start.exchange(false)) {
    g_starting_held = true;
    while (!g_go_on.load() && !vmmipc::testing::WaitsInFutex(g_forker.load())) sched_yield();
  }
  return __real_pthread_sigmask(how, set, old);
}

namespace vmmipc::transport {
namespace {

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
// child reports how many of `inherited` are still open in it after that
// (`still_open`, -1 when it did not say), then lives until Reap.
struct ForkedChild {
  pid_t pid = -1;
  int still_open = -1;
  ScopedFd stay;  // the write end of the pipe whose EOF lets the child exit

  ForkedChild(Listener* listener, const std::vector<int>& inherited) {
    int report[2];
    int stay_pipe[2];
    if (pipe2(report, O_CLOEXEC) != 0) return;
    const ScopedFd report_read(report[0]), report_write(report[1]);
    if (pipe2(stay_pipe, O_CLOEXEC) != 0) return;
    const ScopedFd stay_read(stay_pipe[0]);
    stay.Reset(stay_pipe[1]);
    listener->PrepareFork();
    pid = fork();
    if (pid == 0) {
      log::ResetAfterFork();
      alarm(30);
      close(stay_pipe[1]);
      listener->AbandonAfterFork();
      int open = 0;
      for (const int fd : inherited) open += fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
      (void)!write(report[1], &open, sizeof(open));
      char byte;
      (void)!read(stay_pipe[0], &byte, 1);
      _exit(0);
    }
    listener->ParentAfterFork();
    pollfd reported{report[0], POLLIN, 0};
    if (pid > 0 && poll(&reported, 1, 5000) == 1)
      (void)!read(report[0], &still_open, sizeof(still_open));
  }
  // Lets the child exit; true when it did, with status 0.
  bool Reap() {
    stay.Reset();
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  }
};

// A ForkedChild, expected to hold none of `inherited` (`what`, for the line
// it prints) once it abandoned the listener.
ForkedChild ForkExpectingNoneKept(Listener* listener, const std::vector<int>& inherited,
                                  const char* what) {
  ForkedChild child(listener, inherited);
  EXPECT_GT(child.pid, 0);
  std::printf("the forked child holds %d of the %zu fds it inherited from the listener (%s)\n",
              child.still_open, inherited.size(), what);
  EXPECT_EQ(child.still_open, 0);
  return child;
}

// The listener's sockets (listening, and every connection it accepted) and
// the chunk fds, once `sockets` and `chunks` of them are there (5 s at
// most); empty when they never were.
std::vector<int> ListenerFds(const SocketAddress& address, size_t sockets, size_t chunks) {
  for (const auto start = Clock::now(); ElapsedMs(start) < 5000; usleep(1000)) {
    std::vector<int> fds = SocketsNamed(address);
    const std::vector<int> chunk_fds = ChunkFds();
    if (fds.size() != sockets || chunk_fds.size() != chunks) continue;
    fds.insert(fds.end(), chunk_fds.begin(), chunk_fds.end());
    return fds;
  }
  return {};
}

class TransportListenerFork : public TransportListener {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "a child forked beside running threads may hang in the sanitizer's allocator";
#endif
    TransportListener::SetUp();
  }
  // The body: a listener with a waiting, a kept and a queued connection
  // forks; the child's fds, then the importers' EOFs, are checked.
  void ForkWithEveryKindOfConnection(uint32_t pid);
};

// Before, a forked child kept its copies of the listener's waiting and kept
// connections and of the queued replies (connection and chunk fds) until it
// exited: the importers did not see EOF when the parent closed its end, and
// the child pinned the exported memory. Now it closes every one of them,
// and the parent serves on.
TEST_F(TransportListenerFork, AForkedChildClosesTheConnectionsAndRepliesItInherits) {
  ForkWithEveryKindOfConnection(FakePid());
  ExpectNoFdLeak();
}

void TransportListenerFork::ForkWithEveryKindOfConnection(uint32_t pid) {
  std::atomic<int> calls{0};
  auto listener = MustStart(OneWorker(pid), ByAddress(kQueuedChunks, &calls));
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
  const std::vector<int> inherited = ListenerFds(address, 4, kQueuedChunks);
  ASSERT_FALSE(inherited.empty()) << "the listener does not hold the three connections and chunks";
  ForkedChild child = ForkExpectingNoneKept(
      listener.get(), inherited,
      "its socket, a waiting, a kept and a queued connection, the queued reply's 300 chunks");

  // The child lives on; the parent serves on, and its closes reach the importers.
  EXPECT_EQ(FetchChunks(Request(pid), Client(2000)).status, FetchStatus::kOk);
  hold->Release();
  EXPECT_EQ(queued.ReadReply(5000), 0);
  EXPECT_TRUE(SeesEof(queued.fd.get(), 2000)) << "the queued reply's connection stayed open";
  listener.reset();  // closes the waiting and kept connections
  EXPECT_TRUE(SeesEof(waiting.get(), 2000)) << "the waiting connection stayed open";
  EXPECT_TRUE(SeesEof(kept.fd.get(), 2000)) << "the kept connection stayed open";
  EXPECT_TRUE(child.Reap());
}

// A reply a worker is sending at the fork (held inside its first sendmsg):
// before, its chunk fds were on the worker's stack only, and the child kept
// its copies of all 300 until it exited. Now the reply stays in the workers'
// list while it is sent, and the child closes them; the connection goes by
// name with the others.
TEST_F(TransportListenerFork, AForkedChildClosesTheChunksOfAReplyBeingSent) {
  const uint32_t pid = FakePid();
  std::atomic<int> calls{0};
  {
    auto listener = MustStart(OneWorker(pid), ByAddress(kQueuedChunks, &calls));
    ASSERT_NE(listener, nullptr);
    g_send_hold = std::make_shared<WorkerHold>();
    g_hold_a_batch = true;
    const RawImporter sending = SendRawRequest(pid, kLongReplyAddress, 3);
    ASSERT_TRUE(g_send_hold->WaitHeld(5000)) << "the worker never sent the reply";
    // The listening socket, the connection being answered, the reply's chunks.
    const std::vector<int> inherited = ListenerFds(AbstractAddress(pid), 2, kQueuedChunks);
    ASSERT_FALSE(inherited.empty()) << "the reply being sent is not there";
    ForkedChild child = ForkExpectingNoneKept(
        listener.get(), inherited,
        "its socket, and a reply being sent: its connection and its 300 chunks");
    g_send_hold->Release();
    EXPECT_EQ(sending.ReadReply(5000), 0);
    EXPECT_TRUE(SeesEof(sending.fd.get(), 2000)) << "the connection stayed open";
    EXPECT_TRUE(child.Reap());
  }
  g_hold_a_batch = false;
  g_send_hold.reset();
  ExpectNoFdLeak();
}

// A fork while the poll thread is inside the job queue's lock, a reply just
// queued and the first worker starting (held in its pthread_sigmask): the
// fork handler waits for the lock (the queue is a fork lock), so the child
// finds the queue whole and closes its copies of the reply's fds. Without
// the fork lock the child was made with the queue locked and half-updated.
TEST_F(TransportListenerFork, AForkWaitsForTheQueuesLockAndTheChildClosesWhatItHolds) {
  const uint32_t pid = FakePid();
  std::atomic<int> calls{0};
  {
    auto listener = MustStart(OneWorker(pid), ByAddress(kQueuedChunks, &calls));
    ASSERT_NE(listener, nullptr);
    // Whatever fails below, the poll thread goes on before the listener stops.
    struct GoOn {
      ~GoOn() { g_go_on = true; }
    } go_on_at_exit;
    g_forker = static_cast<pid_t>(::gettid());
    g_go_on = false;
    g_hold_a_thread_start = true;
    const RawImporter queued = SendRawRequest(pid, kLongReplyAddress, 4);
    for (const auto start = Clock::now(); !g_starting_held && ElapsedMs(start) < 5000;)
      sched_yield();
    ASSERT_TRUE(g_starting_held.load()) << "no worker started for the reply";
    // The listening socket, the queued reply's connection and chunks.
    const std::vector<int> inherited = ListenerFds(AbstractAddress(pid), 2, kQueuedChunks);
    ASSERT_FALSE(inherited.empty()) << "the reply is not there";
    ForkedChild child = ForkExpectingNoneKept(
        listener.get(), inherited,
        "its socket, and a reply queued as the queue's lock was held: its connection and 300 "
        "chunks");
    g_go_on = true;
    EXPECT_EQ(queued.ReadReply(5000), 0);
    EXPECT_TRUE(SeesEof(queued.fd.get(), 2000)) << "the connection stayed open";
    EXPECT_TRUE(child.Reap());
  }
  ExpectNoFdLeak();
}

}  // namespace
}  // namespace vmmipc::transport
