// Small process facts the unit tests check leaks and timing with, and a
// connected SOCK_SEQPACKET pair to talk over.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "common/scoped_fd.h"

namespace vmmipc::testing {

// Whether this is a ThreadSanitizer build (some paths differ under it).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// Open descriptors of this process (the directory's own fd included).
inline int FdCount() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count;
}

inline long ElapsedMs(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// Whether every thread of this process but the caller sleeps (S) or is
// stopped (T): none is between two syscalls that open and close an fd.
inline bool OtherThreadsAsleep() {
  const std::string self = std::to_string(static_cast<long>(::gettid()));
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return false;
  bool asleep = true;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.' || self == entry->d_name) continue;
    std::ifstream stat(std::string("/proc/self/task/") + entry->d_name + "/stat");
    const std::string text((std::istreambuf_iterator<char>(stat)),
                           std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos || paren + 2 >= text.size()) continue;  // it ended
    const char state = text[paren + 2];
    asleep = asleep && (state == 'S' || state == 'T');
  }
  closedir(dir);
  return asleep;
}

// This process's fds counted at rest (issue 36 item 7): every other thread
// asleep and `quiet()` true (nothing in flight, such as the reaper's queue),
// twice with the same count between; waits at most `bound_ms`, then fails
// the test and returns -1. A count taken while a thread of the library is
// between an open and a close flakes on a loaded machine.
inline int RestingFdCount(const std::function<bool()>& quiet = nullptr, int bound_ms = 10000) {
  const auto start = std::chrono::steady_clock::now();
  while (ElapsedMs(start) < bound_ms) {
    const int fds = FdCount();
    if (OtherThreadsAsleep() && (!quiet || quiet())) {
      usleep(2000);
      if (FdCount() == fds && OtherThreadsAsleep() && (!quiet || quiet())) return fds;
    }
    usleep(2000);
  }
  ADD_FAILURE() << "this process did not come to rest in " << bound_ms << " ms";
  return -1;
}

// True when thread `tid` of this process sleeps in a futex wait (a lock).
// /proc/<pid>/task/<tid>/syscall starts with the number of the syscall the
// thread is blocked in ("running" when it is not). Raw syscalls only: no
// allocation while another thread forks.
inline bool WaitsInFutex(pid_t tid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[32] = {};
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  char expected[16];
  const int length = snprintf(expected, sizeof(expected), "%ld ", static_cast<long>(SYS_futex));
  return n > length && std::strncmp(text, expected, static_cast<size_t>(length)) == 0;
}

// Two connected SOCK_SEQPACKET Unix sockets (the transport's kind), CLOEXEC.
struct SocketPair {
  ScopedFd a, b;
};
inline SocketPair SeqpacketPair() {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  return {ScopedFd(sv[0]), ScopedFd(sv[1])};
}

}  // namespace vmmipc::testing
