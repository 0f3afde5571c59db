// The kind check of a peer's fds (statx from the kernel's cache, F_GETFL,
// isatty; a regular file's place, then fstatfs) and their hand-over to the
// reaper.
#include "transport/client/peer_fds.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/syscall.h"
#include "transport/reaper/fd_kind.h"
#include "transport/reaper/fd_reaper.h"

namespace vmmipc::transport {
bool IsMemoryFdKind(int fd, std::string* why) {
  // Its inode as the kernel caches it: a FUSE or NFS file's daemon or server
  // is not asked (fd_kind.h; fstat would ask, and might wait for ever).
  CachedStat st;
  if (!StatCached(fd, &st)) {
    *why = fmt::format("statx: {}", ErrnoText(errno));
    return false;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_PATH) != 0) {
    *why = "an O_PATH fd";
    return false;
  }
  switch (st.mode & S_IFMT) {
    case S_IFREG: {
      // A memfd, told by its mount (the kernel's own: its filesystem is
      // asked nothing that waits) and its filesystem's type.
      long type = 0;
      if (IsMemfdMount(st.mount)) {
        if (OnMemoryFilesystem(fd, &type)) return true;
        *why = fmt::format("a regular file of a filesystem of type {:#x}, not memory", type);
        return false;
      }
      // Any other regular file is placed before its filesystem is asked
      // anything (fstatfs would ask FUSE's daemon too): only a memory
      // filesystem's file is device memory, and FUSE's or NFS's close may
      // flush, and wait for ever.
      const FdPlace place = PlaceOf(fd);
      if (place == FdPlace::kListedMayWait || place == FdPlace::kUnlisted) {
        *why =
            "a regular file of a filesystem whose calls may wait on a daemon or server (FUSE, "
            "NFS...), or of a mount this process cannot see";
        return false;
      }
      if (OnMemoryFilesystem(fd, &type)) return true;
      *why = fmt::format("a regular file of a filesystem of type {:#x}, not memory", type);
      return false;
    }
    case 0:  // an anonymous inode carries no file type
      return true;
    case S_IFCHR:
      // A terminal's last close may wait for its output to drain.
      if (::isatty(fd) == 0) return true;
      *why = "a terminal";
      return false;
    case S_IFSOCK:
      *why = "a socket";
      return false;
    case S_IFIFO:
      *why = "a pipe or FIFO";
      return false;
    case S_IFDIR:
      *why = "a directory";
      return false;
    case S_IFBLK:
      *why = "a block device";
      return false;
    default:
      *why = fmt::format("a file of type {:#o}", st.mode & S_IFMT);
      return false;
  }
}

bool AllMemoryFdKinds(const std::vector<ScopedFd>& fds, std::string* why) {
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string what;
    if (!IsMemoryFdKind(fds[i].get(), &what)) {
      *why = fmt::format("fd {} of {} is {}, not device memory", i + 1, fds.size(), what);
      return false;
    }
  }
  return true;
}

void HandToReaper(std::vector<ScopedFd>* fds) noexcept {
  for (ScopedFd& fd : *fds) {
    if (!fd.valid()) continue;
    // The hand-over closes the host's copy here: for such a file that close
    // is the one that waits.
    if (EveryCloseMayWait(fd.get())) {
      KeepOpen(std::move(fd));
    } else {
      CloseInBackground(std::move(fd));
    }
  }
  fds->clear();
}

}  // namespace vmmipc::transport
