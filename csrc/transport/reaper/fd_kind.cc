// The kinds of fd whose close may wait (fd_kind.h).
#include "transport/reaper/fd_kind.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace vmmipc::transport {
namespace {

// linux/magic.h's, spelled here so that no kernel header is needed.
constexpr long kTmpfsMagic = 0x01021994;      // tmpfs and shmem: memfd_create
constexpr long kHugetlbfsMagic = 0x958458f6;  // memfd_create(MFD_HUGETLB)

}  // namespace

// Files that hold memory and nothing else: their close never waits on
// anyone. Any other filesystem's (FUSE, NFS, a disk's) may flush on every
// close, and FUSE's flush waits for its daemon for ever.
bool OnMemoryFilesystem(int fd, long* type) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) {
    *type = -1;
    return false;
  }
  *type = static_cast<long>(fs.f_type);
  return *type == kTmpfsMagic || *type == kHugetlbfsMagic;
}

bool EveryCloseMayWait(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return true;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_PATH) != 0) return false;  // no file operations at all
  switch (st.st_mode & S_IFMT) {
    case S_IFREG:
    case S_IFDIR: {
      long type = 0;
      return !OnMemoryFilesystem(fd, &type);
    }
    default:
      return false;  // sockets, pipes, devices, anonymous inodes: no flush that waits on a peer
  }
}

bool CloseNeverWaits(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  switch (st.st_mode & S_IFMT) {
    case S_IFREG: {
      long type = 0;
      return OnMemoryFilesystem(fd, &type);
    }
    case 0:  // an anonymous inode carries no file type
    case S_IFIFO:
      return true;
    case S_IFCHR:
      // A terminal's last close may wait for its output to drain.
      return ::isatty(fd) == 0;
    default:
      return false;  // sockets (linger, queued fds), directories, block devices
  }
}

}  // namespace vmmipc::transport
