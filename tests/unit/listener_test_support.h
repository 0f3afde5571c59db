// What the listener tests share (transport_listener_test.cc,
// transport_listener_bounds_test.cc): the exporter's secret, fake pids for
// socket names, a handler granting memfd chunks, a genuine request for its
// handle, options, a forked child to run a body in, a raw importer that
// sends its request and reads the reply when told, a hold point for the
// workers, and the fixture that checks that no fd was left behind.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/log.h"
#include "test_process.h"
#include "transport/client/fetch_client.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/listener/listener.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
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

// Options with one worker, which a hold point can keep busy.
inline ListenerOptions OneWorker(uint32_t pid) {
  ListenerOptions o = Options(pid, 5000);
  o.max_workers = 1;
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

// Where ByAddress's long reply is asked for (kBase + 16 is a short one).
inline constexpr uint64_t kLongReplyAddress = kBase + 32;

// A handler granting `long_chunks` chunks (more than one message holds: a
// worker sends them) for kLongReplyAddress, and one for any other address;
// counts its calls in `*calls`.
inline ServeHandler ByAddress(size_t long_chunks, std::atomic<int>* calls) {
  return [long_reply = ChunksHandler(long_chunks), short_reply = ChunksHandler(1),
          calls](const ServeRequest& r) {
    ++*calls;
    return r.address == kLongReplyAddress ? long_reply(r) : short_reply(r);
  };
}

// An importer at the socket level: connected, its request for the handle of
// `address` (under pid's name) sent, the reply not read until ReadReply.
struct RawImporter {
  ScopedFd fd;
  wire::Request request;

  // The reply's status (0: granted, every batch read and its fds closed), -1
  // when nothing came within `ms`, -2 when a message does not verify.
  int ReadReply(int ms) const {
    std::vector<uint8_t> buffer(wire::kMaxReplySize);
    const Deadline deadline = Deadline::AfterMs(ms);
    while (true) {
      ReceivedMessage m;  // its fds close with it
      if (!ReceiveMessage(fd.get(), buffer, &m, deadline).ok()) return -1;
      wire::ReplyHeader h;
      std::vector<wire::ReplyEntry> entries;
      if (wire::ParseReply(std::span<const uint8_t>(buffer.data(), m.length), request.nonce,
                           wire::KeyFor(kSecret, request.handle), &h,
                           &entries) != wire::WireError::kOk)
        return -2;
      if (h.status != 0 || h.batch_index + 1 >= h.batch_count) return h.status;
    }
  }
};

inline RawImporter SendRawRequest(uint32_t pid, uint64_t address, uint8_t nonce = 0x5a) {
  RawImporter importer;
  importer.request.handle = Request(pid).handle;
  importer.request.handle.address = address;
  importer.request.nonce.fill(nonce);
  EXPECT_TRUE(ConnectSeqpacket(AbstractAddress(pid), Deadline::AfterMs(1000), &importer.fd).ok());
  const auto bytes =
      wire::EncodeRequest(importer.request, wire::KeyFor(kSecret, importer.request.handle));
  EXPECT_TRUE(SendMessage(importer.fd.get(), bytes, {}, Deadline::AfterMs(1000)).ok());
  return importer;
}

// A hold point for the listener's workers: a task posted with Block keeps
// its worker until Release (or the hold point's end). Held through a
// shared_ptr by the task, so that a test that ends early cannot leave the
// worker waiting on freed memory, nor the listener's stop on the worker.
class WorkerHold {
 public:
  ~WorkerHold() { Release(); }
  void Block() {
    std::unique_lock lock(mutex_);
    held_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return released_; });
  }
  // Whether a worker is blocked here (waits at most `ms`).
  bool WaitHeld(int ms) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return held_; });
  }
  void Release() {
    std::lock_guard lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool released_ = false;
};

// Keeps the one worker of `listener` (max_workers 1) on a WorkerHold until
// it is released; nullptr when it did not get there within a second.
inline std::shared_ptr<WorkerHold> HoldTheWorker(Listener* listener) {
  auto hold = std::make_shared<WorkerHold>();
  listener->Post([hold] { hold->Block(); });
  return hold->WaitHeld(1000) ? hold : nullptr;
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
