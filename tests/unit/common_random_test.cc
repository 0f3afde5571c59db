// FillRandom's sources in turn (common/random.h): getrandom, else
// /dev/urandom, else nothing; FillUnique without either; and the process
// identity made from them (core/process_state.cc: no secret without
// randomness, an instance that is never 0). This binary is linked with
// -Wl,--wrap=getrandom,--wrap=open,--wrap=read (tests/CMakeLists.txt): each
// test arms the answers it needs, everything else passes through.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/random.h"
#include "core/identity.h"

extern "C" ssize_t __real_getrandom(void* buffer, size_t size, unsigned int flags);
extern "C" int __real_open(const char* path, int flags, ...);
extern "C" ssize_t __real_read(int fd, void* buffer, size_t size);

namespace {

// getrandom: fail with this errno (0: pass through), after `getrandom_eintr`
// EINTRs, in pieces of at most `getrandom_piece` bytes (0: whole).
int g_getrandom_errno = 0;
int g_getrandom_eintr = 0;
size_t g_getrandom_piece = 0;
int g_getrandom_calls = 0;
unsigned int g_getrandom_flags = 0;
// open("/dev/urandom"): fail with this errno (0: pass through).
int g_urandom_open_errno = 0;
int g_urandom_opens = 0;
int g_urandom_open_flags = 0;
int g_urandom_fd = -1;
// read of that fd: `urandom_eintr` EINTRs first, then pieces of at most
// `urandom_piece` bytes (0: whole); `urandom_ends_after` bytes, then 0 (-1: never).
int g_urandom_eintr = 0;
size_t g_urandom_piece = 0;
long g_urandom_ends_after = -1;
int g_urandom_reads = 0;

void Reset() {
  g_getrandom_errno = g_getrandom_eintr = g_getrandom_calls = 0;
  g_getrandom_piece = 0;
  g_getrandom_flags = 0;
  g_urandom_open_errno = g_urandom_opens = g_urandom_open_flags = 0;
  g_urandom_fd = -1;
  g_urandom_eintr = g_urandom_reads = 0;
  g_urandom_piece = 0;
  g_urandom_ends_after = -1;
}

}  // namespace

extern "C" ssize_t __wrap_getrandom(void* buffer, size_t size, unsigned int flags) {
  ++g_getrandom_calls;
  g_getrandom_flags = flags;
  if (g_getrandom_eintr > 0) {
    --g_getrandom_eintr;
    errno = EINTR;
    return -1;
  }
  if (g_getrandom_errno != 0) {
    errno = g_getrandom_errno;
    return -1;
  }
  if (g_getrandom_piece != 0) size = std::min(size, g_getrandom_piece);
  return __real_getrandom(buffer, size, flags);
}

extern "C" int __wrap_open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if ((flags & O_CREAT) != 0) {
    va_list args;
    va_start(args, flags);
    mode = static_cast<mode_t>(va_arg(args, int));
    va_end(args);
  }
  if (std::strcmp(path, "/dev/urandom") != 0) return __real_open(path, flags, mode);
  ++g_urandom_opens;
  g_urandom_open_flags = flags;
  if (g_urandom_open_errno != 0) {
    errno = g_urandom_open_errno;
    return -1;
  }
  g_urandom_fd = __real_open(path, flags, mode);
  return g_urandom_fd;
}

extern "C" ssize_t __wrap_read(int fd, void* buffer, size_t size) {
  if (fd < 0 || fd != g_urandom_fd) return __real_read(fd, buffer, size);
  ++g_urandom_reads;
  if (g_urandom_eintr > 0) {
    --g_urandom_eintr;
    errno = EINTR;
    return -1;
  }
  if (g_urandom_ends_after == 0) return 0;
  if (g_urandom_piece != 0) size = std::min(size, g_urandom_piece);
  if (g_urandom_ends_after > 0) size = std::min(size, static_cast<size_t>(g_urandom_ends_after));
  const ssize_t n = __real_read(fd, buffer, size);
  if (n > 0 && g_urandom_ends_after > 0) g_urandom_ends_after -= n;
  return n;
}

namespace vmmipc {
namespace {

using Bytes = std::array<uint8_t, 32>;

bool AllZero(const Bytes& bytes) {
  for (uint8_t b : bytes)
    if (b != 0) return false;
  return true;
}

TEST(Random, GetrandomFirstWithoutWaiting) {
  Reset();
  Bytes bytes{};
  RandomFailure failure;
  ASSERT_TRUE(FillRandom(bytes.data(), bytes.size(), &failure));
  EXPECT_FALSE(AllZero(bytes));
  EXPECT_EQ(g_getrandom_flags & GRND_NONBLOCK, GRND_NONBLOCK);
  EXPECT_EQ(g_urandom_opens, 0);
  EXPECT_EQ(failure.getrandom_error, 0);
}

TEST(Random, GetrandomInterruptedOrShortIsContinued) {
  Reset();
  g_getrandom_eintr = 2;
  g_getrandom_piece = 5;
  Bytes bytes{};
  ASSERT_TRUE(FillRandom(bytes.data(), bytes.size()));
  EXPECT_EQ(g_getrandom_calls, 2 + 7);  // two EINTRs, then 32 bytes in pieces of 5
  EXPECT_EQ(g_urandom_opens, 0);
  // The last piece (bytes 30 and 31) was written: both zero is 1 in 65,536
  // by chance (one byte was 1 in 256, which failed once in a loaded run).
  EXPECT_TRUE(bytes[30] != 0 || bytes[31] != 0) << "the last piece was not filled";
}

TEST(Random, GetrandomRefusedFallsBackToUrandom) {
  for (int refusal : {EPERM, ENOSYS, EAGAIN}) {
    Reset();
    g_getrandom_errno = refusal;
    Bytes first{}, second{};
    RandomFailure failure;
    ASSERT_TRUE(FillRandom(first.data(), first.size(), &failure)) << refusal;
    ASSERT_TRUE(FillRandom(second.data(), second.size())) << refusal;
    EXPECT_EQ(g_urandom_opens, 2);
    EXPECT_EQ(g_urandom_open_flags & O_CLOEXEC, O_CLOEXEC);
    EXPECT_EQ(g_urandom_open_flags & O_ACCMODE, O_RDONLY);
    EXPECT_EQ(failure.getrandom_error, refusal);
    EXPECT_EQ(failure.urandom_error, 0);
    EXPECT_NE(first, second);
  }
}

TEST(Random, UrandomInterruptedOrShortIsContinued) {
  Reset();
  g_getrandom_errno = EPERM;
  g_urandom_eintr = 2;
  g_urandom_piece = 3;
  Bytes bytes{};
  ASSERT_TRUE(FillRandom(bytes.data(), bytes.size()));
  EXPECT_EQ(g_urandom_reads, 2 + 11);  // two EINTRs, then 32 bytes in pieces of 3
  // The last piece (bytes 30 and 31) was written: both zero is 1 in 65,536
  // by chance (one byte was 1 in 256, which failed once in a loaded run).
  EXPECT_TRUE(bytes[30] != 0 || bytes[31] != 0) << "the last piece was not filled";
}

TEST(Random, NeitherSourceIsAFailureThatSaysWhy) {
  Reset();
  g_getrandom_errno = EPERM;
  g_urandom_open_errno = ENOENT;
  Bytes bytes{};
  RandomFailure failure;
  EXPECT_FALSE(FillRandom(bytes.data(), bytes.size(), &failure));
  EXPECT_EQ(failure.getrandom_error, EPERM);
  EXPECT_EQ(failure.urandom_error, ENOENT);
  // A /dev/urandom that ends early gives nothing either.
  Reset();
  g_getrandom_errno = ENOSYS;
  g_urandom_ends_after = 10;
  EXPECT_FALSE(FillRandom(bytes.data(), bytes.size(), &failure));
  EXPECT_EQ(failure.urandom_error, EIO);
}

TEST(Random, UniqueWithoutEitherSourceStillNeverRepeats) {
  Reset();
  g_getrandom_errno = EPERM;
  g_urandom_open_errno = EACCES;
  Bytes first{}, second{};
  FillUnique(first.data(), first.size());
  FillUnique(second.data(), second.size());
  EXPECT_FALSE(AllZero(first));
  EXPECT_NE(first, second);
  // In another process (the pid differs, the counter and clocks may not).
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    Bytes theirs{};
    FillUnique(theirs.data(), theirs.size());
    _exit(write(pipe_fds[1], theirs.data(), theirs.size()) == static_cast<ssize_t>(theirs.size())
              ? 0
              : 1);
  }
  Bytes theirs{};
  ASSERT_EQ(__real_read(pipe_fds[0], theirs.data(), theirs.size()),
            static_cast<ssize_t>(theirs.size()));
  waitpid(child, nullptr, 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_NE(theirs, first);
  EXPECT_NE(theirs, second);
}

// The process state made in a child with `getrandom` and /dev/urandom
// failing as armed: exit 0 when `check(state)` holds.
template <typename Check>
int IdentityInChild(int getrandom_errno, int urandom_errno, Check check) {
  const pid_t child = fork();
  if (child == 0) {
    Reset();
    g_getrandom_errno = getrandom_errno;
    g_urandom_open_errno = urandom_errno;
    _exit(check(core::OwnIdentity()) ? 0 : 1);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(Random, WithoutRandomnessAProcessHasNoSecretAndAnInstanceAllTheSame) {
  EXPECT_EQ(IdentityInChild(EPERM, ENOENT,
                            [](const core::Identity& self) {
                              return !self.has_secret && self.instance != 0 &&
                                     self.secret.k0 == 0 && self.secret.k1 == 0 &&
                                     self.no_secret.getrandom_error == EPERM &&
                                     self.no_secret.urandom_error == ENOENT;
                            }),
            0);
  // /dev/urandom alone makes the secret.
  EXPECT_EQ(IdentityInChild(EPERM, 0,
                            [](const core::Identity& self) {
                              return self.has_secret && self.instance != 0 &&
                                     (self.secret.k0 != 0 || self.secret.k1 != 0);
                            }),
            0);
}

}  // namespace
}  // namespace vmmipc
