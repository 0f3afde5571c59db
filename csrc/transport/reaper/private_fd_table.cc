// Entering a private fd table: probe, unshare, copy the one fd in, fill stdio.
#include "transport/reaper/private_fd_table.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // Linux 5.3
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438  // Linux 5.6
#endif
#ifndef SYS_close_range
#define SYS_close_range 436  // Linux 5.9 for CLOSE_RANGE_UNSHARE
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

namespace vmmipc::transport {
namespace {

long PidfdOpenSelf() { return ::syscall(SYS_pidfd_open, ::getpid(), 0); }

}  // namespace

int EnterPrivateFdTable(int fd, bool* unshared) {
  *unshared = false;
  const long probe_pidfd = PidfdOpenSelf();
  if (probe_pidfd < 0) return -1;  // before 5.3, or a seccomp policy
  // pidfd_getfd on our own process: same thread group, so no ptrace
  // permission is needed (before 5.6, or refused by seccomp: -1).
  const long probe = ::syscall(SYS_pidfd_getfd, probe_pidfd, fd, 0);
  ::close(static_cast<int>(probe_pidfd));
  if (probe < 0) return -1;
  ::close(static_cast<int>(probe));
  // An empty table of our own, no copy of the host's fds: a copy would keep
  // the host's files open (a pipe it closes would never see its end).
  if (::syscall(SYS_close_range, 0u, ~0u, CLOSE_RANGE_UNSHARE) != 0) return -1;
  *unshared = true;
  // `fd` first (two fds at most: a host near its fd limit has the same
  // limit here), then 0, 1 and 2 filled so that nothing received lands on
  // the stdio numbers, which a sanitizer's report or the C library's last
  // words would write to.
  const long pidfd = PidfdOpenSelf();
  // The thread group's leader holds the host's table; pidfd_getfd reads it.
  const long own = pidfd < 0 ? -1 : ::syscall(SYS_pidfd_getfd, pidfd, fd, 0);
  if (pidfd >= 0) ::close(static_cast<int>(pidfd));
  for (int i = 0; i < 3; ++i) {
    if (::fcntl(i, F_GETFD) < 0) ::open("/dev/null", O_RDWR | O_CLOEXEC);
  }
  return static_cast<int>(own);
}

}  // namespace vmmipc::transport
