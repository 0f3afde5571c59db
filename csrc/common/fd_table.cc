// The fd table's size, read and grown. F_DUPFD asks the kernel for the lowest
// free fd at or above a number: the table is expanded to hold that number
// (to the next power of two) in one step, and stays so after the close.
#include "common/fd_table.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/scoped_fd.h"

namespace vmmipc {

bool GrowFdTable(int fds) noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  long target = fds;
  if (limit.rlim_cur != RLIM_INFINITY) target = std::min<long>(target, limit.rlim_cur);
  if (target <= 1 || FdTableSize() >= target) return false;
  // Any open fd will do as the one duplicated (the copy lives for two
  // syscalls, after the growth): stderr, stdout or stdin when open, so that
  // no fd of ours is open for the grace period the growth waits for; else an
  // eventfd made for it (a daemon may have closed all three).
  ScopedFd made;
  int source = -1;
  for (int fd : {2, 1, 0}) {
    if (::fcntl(fd, F_GETFD) != -1) {
      source = fd;
      break;
    }
  }
  if (source < 0) {
    made.Reset(::eventfd(0, EFD_CLOEXEC));
    if (!made) return false;
    source = made.get();
  }
  ScopedFd high(::fcntl(source, F_DUPFD_CLOEXEC, static_cast<int>(target - 1)));
  return high.valid();
}

int FdTableSize() noexcept {
  std::FILE* status = std::fopen("/proc/self/status", "re");
  if (status == nullptr) return -1;
  char line[256];
  int size = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::strncmp(line, "FDSize:", 7) == 0) {
      size = std::atoi(line + 7);
      break;
    }
  }
  std::fclose(status);
  return size;
}

}  // namespace vmmipc
