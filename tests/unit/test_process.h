// Small process facts the unit tests check leaks and timing with, and a
// connected SOCK_SEQPACKET pair to talk over.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>

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
