// The listener's poll thread out of memory (issue 36 item 6): its loop is
// noexcept, so an allocation that throws there (the poll set growing with a
// flood of connections) ended the process through std::terminate. Staged by
// replacing the global operator new in this binary of its own: while armed,
// every allocation of kLarge bytes or more on the thread named vmmipc-listen
// throws (the small ones, a log line's, are left to succeed: the poll set's
// growth is what is staged).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "listener_test_support.h"

namespace {

constexpr size_t kLarge = 2048;  // more than 256 pollfds
std::atomic<bool> g_armed{false};
std::atomic<int> g_refused{0};

bool OnThePollThread() {
  char name[16] = {};
  return pthread_getname_np(pthread_self(), name, sizeof(name)) == 0 &&
         std::strcmp(name, "vmmipc-listen") == 0;
}

}  // namespace

void* operator new(size_t size) {
  if (size >= kLarge && g_armed.load(std::memory_order_relaxed) && OnThePollThread()) {
    g_refused.fetch_add(1);
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace vmmipc::transport::listener_test {
namespace {

TEST(TransportListenerOom, APollThreadOutOfMemoryKeepsServing) {
  const uint32_t pid = FakePid();
  // Armed from the start: the poll thread's first large allocation (the
  // room it makes for its poll set) fails too.
  g_armed = true;
  auto listener = MustStart(Options(pid, 2000), ChunksHandler(1));
  ASSERT_NE(listener, nullptr);
  // 200 silent connections, past the room the poll set has (128 entries,
  // 1 KiB; the next growth is 2 KiB).
  const SocketAddress address = AbstractAddress(pid);
  std::vector<ScopedFd> silent;
  for (int i = 0; i < 200; ++i) {
    ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(fd.get(), address.get(), address.length), 0);
    silent.push_back(std::move(fd));
  }
  // Bounded: until the poll thread has met an allocation that failed.
  const auto start = Clock::now();
  while (g_refused.load() < 2 && ElapsedMs(start) < 5000) usleep(1000);
  const int refused = g_refused.load();
  // Still alive (std::terminate would have ended this process), and serving
  // once memory is back.
  g_armed = false;
  silent.clear();
  const FetchResult after = FetchChunks(Request(pid), Client(3000));
  std::printf("allocations refused on the poll thread: %d; then: %s\n", refused,
              FetchStatusName(after.status));
  EXPECT_GE(refused, 2) << "the stage did not reach the poll set's growth";
  EXPECT_EQ(after.status, FetchStatus::kOk) << after.detail;
}

}  // namespace
}  // namespace vmmipc::transport::listener_test
