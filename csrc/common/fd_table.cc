// The fd table's size, read and grown. F_DUPFD asks the kernel for the lowest
// free fd at or above a number: the table is expanded to hold that number
// (to the next power of two) in one step, and stays so after the close.
#include "common/fd_table.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/scoped_fd.h"
#include "common/syscall.h"

namespace vmmipc {
namespace {

// The number after `prefix` at the start of `line`, or -1.
int FieldValue(const char* line, const char* prefix) {
  const size_t length = std::strlen(prefix);
  if (std::strncmp(line, prefix, length) != 0) return -1;
  const char* p = line + length;
  while (*p == ' ' || *p == '\t') ++p;
  if (*p < '0' || *p > '9') return -1;
  long value = 0;
  for (; *p >= '0' && *p <= '9' && value < (1L << 30); ++p) value = value * 10 + (*p - '0');
  return static_cast<int>(value);
}

// The soft limit on fds, or -1 when there is none (or it cannot be read: then
// F_DUPFD itself refuses what is past the limit).
long SoftLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<long>(std::min<rlim_t>(limit.rlim_cur, 1L << 30));
}

// What GrowFdTable grows to: `fds` within the soft limit; 0 when nothing to do.
long Target(int fds, int size) {
  long target = fds;
  if (const long soft = SoftLimit(); soft >= 0) target = std::min(target, soft);
  return target <= 1 || (size >= 0 && size >= target) ? 0 : target;
}

bool GrowTo(long target) {
  // An fd of its own, never one of the process's (0, 1, 2 or another): the
  // copy is closed again, and that close would drop the process's record
  // locks on the file.
  ScopedFd own(::eventfd(0, EFD_CLOEXEC));
  if (!own) return false;
  ScopedFd high(::fcntl(own.get(), F_DUPFD_CLOEXEC, static_cast<int>(target - 1)));
  return high.valid();
}

}  // namespace

FdTableStatus ReadFdTableStatus() noexcept {
  FdTableStatus status;
  const int fd = RetryOnEintr([] { return ::open("/proc/self/status", O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return status;
  ScopedFd file(fd);
  // Line by line through a small buffer: only the first bytes of each line
  // are kept (the two wanted are short; Groups: may be long).
  char chunk[512];
  char line[64];
  size_t used = 0;
  for (;;) {
    const ssize_t n = RetryOnEintr([&] { return ::read(file.get(), chunk, sizeof(chunk)); });
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (chunk[i] != '\n') {
        if (used < sizeof(line) - 1) line[used++] = chunk[i];
        continue;
      }
      line[used] = '\0';
      used = 0;
      if (const int size = FieldValue(line, "FDSize:"); size >= 0) status.size = size;
      if (const int threads = FieldValue(line, "Threads:"); threads >= 0) status.threads = threads;
    }
    if (status.size >= 0 && status.threads >= 0) break;
  }
  return status;
}

int FdTableSize() noexcept { return ReadFdTableStatus().size; }

bool GrowFdTable(int fds) noexcept {
  const long target = Target(fds, FdTableSize());
  return target != 0 && GrowTo(target);
}

EarlyGrowth GrowFdTableWhileSingleThreaded(int fds) noexcept {
  const FdTableStatus status = ReadFdTableStatus();
  if (status.size < 0 || status.threads < 0) return EarlyGrowth::kUnknown;
  if (status.threads != 1) return EarlyGrowth::kThreaded;
  const long target = Target(fds, status.size);
  if (target == 0) return EarlyGrowth::kLargeEnough;
  return GrowTo(target) ? EarlyGrowth::kGrown : EarlyGrowth::kFailed;
}

const char* EarlyGrowthName(EarlyGrowth growth) noexcept {
  switch (growth) {
    case EarlyGrowth::kGrown:
      return "grown at load";
    case EarlyGrowth::kLargeEnough:
      return "large enough at load";
    case EarlyGrowth::kThreaded:
      return "left alone at load: the process had more than one thread";
    case EarlyGrowth::kUnknown:
      return "left alone at load: /proc/self/status unreadable";
    case EarlyGrowth::kFailed:
      return "not grown at load: no fd, or the kernel refused";
  }
  return "?";
}

}  // namespace vmmipc
