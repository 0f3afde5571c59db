// The fd budget's measurement (RLIMIT_NOFILE, /proc/self/fd) and its caps.
#include "transport/serve/fd_budget.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/syscall.h"

namespace vmmipc::transport {
namespace {

// How often a class at its cap may have the budget measured again: a count
// of /proc/self/fd costs a few syscalls per thousand fds.
constexpr int64_t kRefreshMs = 1000;
// The kernel's own bound on RLIMIT_NOFILE (fs.nr_open at most); an unlimited
// soft limit counts as this.
constexpr size_t kMostFds = size_t{1} << 30;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t SoftFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur > kMostFds)
    return kMostFds;
  return static_cast<size_t>(limit.rlim_cur);
}

// A lower bound on the fds open when /proc cannot be read: the lowest free
// number (every fd below it is open), taken by an fd of our own (never a copy
// of one of the host's: closing a copy drops the host's POSIX locks on its file).
size_t LowestFreeFd(size_t limit) {
  const int probe = ::eventfd(0, EFD_CLOEXEC);
  if (probe < 0) return limit;  // not even one fd to spare
  ::close(probe);
  return static_cast<size_t>(probe);
}

size_t Clamp(size_t value, size_t most) { return std::clamp<size_t>(value, 1, most); }

}  // namespace

ConnectionCaps CapsFor(size_t limit, size_t open, size_t held) {
  const size_t host_open = open > held ? open - held : 0;
  const size_t free = limit > host_open ? limit - host_open : 0;
  ConnectionCaps caps;
  caps.own_waiting = Clamp(free / 4, kMaxOwnWaiting);
  caps.watchers = Clamp(free / 4, kMaxWatchConnections);
  caps.others_waiting = Clamp(free / 16, kMaxOthersWaiting);
  caps.per_other_uid = Clamp(caps.others_waiting / 2, kMaxPerOtherUid);
  // None at all when fds are that short: a kept connection is a convenience.
  caps.kept = std::min(free / 8, kMaxKeptConnections);
  caps.queued_reply_fds = Clamp(free / 8, kMaxQueuedReplyFds);
  return caps;
}

bool ForEachOpenFd(void (*visit)(int fd, void* arg), void* arg) noexcept {
  const int dir =
      RetryOnEintr([] { return ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  if (dir < 0) return false;
  // getdents64 by syscall: its glibc wrapper is newer than the glibc vmmipc
  // supports, and readdir would allocate. The kernel walks /proc/self/fd by
  // fd number, so a visit that closes its fd does not disturb the walk.
  alignas(dirent64) char buffer[8192];
  bool read_all = true;
  while (true) {
    const long n = ::syscall(SYS_getdents64, dir, buffer, sizeof(buffer));
    if (n <= 0) {
      read_all = n == 0;
      break;
    }
    for (long at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
      at += entry->d_reclen;
      if (entry->d_name[0] == '.') continue;  // "." or ".."
      int fd = 0;
      for (const char* c = entry->d_name; *c >= '0' && *c <= '9'; ++c) fd = fd * 10 + (*c - '0');
      if (fd != dir) visit(fd, arg);
    }
  }
  ::close(dir);
  return read_all;
}

long CountOpenFds() noexcept {
  long count = 0;
  if (!ForEachOpenFd([](int, void* counted) { ++*static_cast<long*>(counted); }, &count)) return -1;
  return count;
}

void FdBudget::Measure(size_t held, bool out_of_fds) noexcept {
  limit_ = SoftFdLimit();
  size_t open = limit_;
  if (!out_of_fds) {
    const long counted = CountOpenFds();
    open = counted >= 0 ? static_cast<size_t>(counted) : LowestFreeFd(limit_);
  }
  host_open_ = open > held ? open - held : 0;
  free_ = limit_ > host_open_ ? limit_ - host_open_ : 0;
  caps_ = CapsFor(limit_, open, held);
  measured_ms_ = NowMs();
}

bool FdBudget::Refresh(size_t held) noexcept {
  if (NowMs() - measured_ms_ < kRefreshMs) return false;
  Measure(held, false);
  return true;
}

bool FdBudget::Outgrown(int fd, size_t held) const noexcept {
  // A margin, so that the fds of replies in flight (a chunk's, a connection
  // on its way to the reaper) do not count as the host's growth.
  const size_t margin = std::max<size_t>(8, free_ / 16);
  return fd >= 0 && static_cast<size_t>(fd) >= host_open_ + held + margin;
}

}  // namespace vmmipc::transport
