// What the listener tests share (transport_listener_test.cc,
// transport_listener_bounds_test.cc): the exporter's secret, fake pids for
// socket names, a handler granting memfd chunks, a genuine request for its
// handle, options, a forked child to run a body in, and the fixture that
// checks that no fd was left behind.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/log.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_address.h"
#include "transport/wire.h"

namespace vmmipc::transport::listener_test {

using Clock = std::chrono::steady_clock;

inline const SipKey kSecret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};  // the exporter's
inline constexpr uint64_t kBase = 0x7f1200000000ULL;
inline constexpr uint64_t kChunk = 4096;
inline constexpr uint64_t kForged = 0xbadbadbadbadULL;  // a capability the exporter never made

using vmmipc::testing::ElapsedMs;
using vmmipc::testing::FdCount;

// Pids for names, above the kernel's pid_max (4194304) so they never collide
// with a real process's listener, and distinct per test and per test process.
inline uint32_t FakePid() {
  static std::atomic<uint32_t> counter{0};
  return 0x10000000u + (static_cast<uint32_t>(getpid()) << 6) + (counter++ & 63u);
}

inline ScopedFd Memfd(uint32_t tag) {
  ScopedFd fd(memfd_create("transport-listener-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), kChunk), 0);
  EXPECT_EQ(pwrite(fd.get(), &tag, sizeof(tag), 0), static_cast<ssize_t>(sizeof(tag)));
  return fd;
}

inline uint32_t TagOf(int fd) {
  uint32_t tag = 0;
  EXPECT_EQ(pread(fd, &tag, sizeof(tag), 0), static_cast<ssize_t>(sizeof(tag)));
  return tag;
}

// A handler granting `count` memfd chunks from kBase, in shuffled order; chunk
// i holds the tag 1000 + i.
inline ServeHandler ChunksHandler(size_t count, std::atomic<int>* calls = nullptr) {
  return [count, calls](const ServeRequest&) {
    if (calls != nullptr) ++*calls;
    ServeReply reply;
    for (size_t i = 0; i < count; ++i) {
      ChunkGrant g;
      g.address = kBase + i * kChunk;
      g.size = kChunk;
      g.generation = 7;
      g.fd = Memfd(static_cast<uint32_t>(1000 + i));
      reply.chunks.push_back(std::move(g));
    }
    std::shuffle(reply.chunks.begin(), reply.chunks.end(), std::mt19937(42));
    return reply;
  };
}

inline ListenerOptions Options(uint32_t pid, int timeout_ms = 200, std::string dir = "") {
  ListenerOptions o;
  o.secret = kSecret;
  o.pid = pid;
  o.socket_dir = std::move(dir);
  o.timeout = Timeout::Ms(timeout_ms);
  return o;
}

// A request for the handle the exporter made for kBase + 16 (capability 0:
// the genuine one, as the exporter computes it).
inline FetchRequest Request(uint32_t pid, uint64_t capability = 0) {
  FetchRequest r;
  r.handle.exporter_pid = pid;
  r.handle.address = kBase + 16;
  r.handle.chunk_base = kBase;
  r.handle.chunk_size = kChunk;
  r.handle.region_base = kBase;
  r.handle.generation = 7;
  r.capability = capability != 0 ? capability : wire::Capability(kSecret, r.handle);
  return r;
}

// The key of the records about Request(pid)'s handle.
inline SipKey GenuineKey(uint32_t pid) { return wire::KeyFor(kSecret, Request(pid).handle); }

inline ClientOptions Client(int timeout_ms = 1000, std::string dir = "") {
  ClientOptions c;
  c.timeout = Timeout::Ms(timeout_ms);
  c.socket_dir = std::move(dir);
  return c;
}

// The abstract socket name of fake pid `pid` under our uid (empty on failure).
inline SocketAddress AbstractAddress(uint32_t pid) {
  SocketAddress address;
  std::string error;
  EXPECT_TRUE(MakeSocketAddress(geteuid(), SocketOwner::Pid(pid), "", &address, &error)) << error;
  return address;
}

inline std::unique_ptr<Listener> MustStart(const ListenerOptions& o, ServeHandler h) {
  std::string error;
  auto l = Listener::Start(o, std::move(h), &error);
  EXPECT_NE(l, nullptr) << error;
  return l;
}

// Runs `body` in a forked child and returns its exit code (or 100 + signal).
inline int InChild(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    log::ResetAfterFork();
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

class TransportListener : public ::testing::Test {
 protected:
  void SetUp() override { fds_before_ = OwnFds(); }
  // The process's fds but the reaper's inbox, which stays from its first use.
  static int OwnFds() { return FdCount() - static_cast<int>(ReaperHostFdsForTesting()); }
  void ExpectNoFdLeak(const std::string& what = "") {
    // Connections that may hold a peer's fds are closed by the reaper thread.
    for (int i = 0; i < 2000 && (ReaperPendingForTesting() > 0 || OwnFds() != fds_before_); ++i)
      usleep(1000);
    EXPECT_EQ(OwnFds(), fds_before_) << "file descriptors leaked " << what;
  }
  int fds_before_ = 0;
};

}  // namespace vmmipc::transport::listener_test
