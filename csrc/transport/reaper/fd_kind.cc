// The kinds of fd whose close may wait (fd_kind.h).
#include "transport/reaper/fd_kind.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vmmipc::transport {
namespace {

// linux/magic.h's, spelled here so that no kernel header is needed.
constexpr long kTmpfsMagic = 0x01021994;      // tmpfs and shmem: memfd_create
constexpr long kHugetlbfsMagic = 0x958458f6;  // memfd_create(MFD_HUGETLB)

// Filesystem types (mountinfo's) whose stat and close never wait on another
// process or a server: memory, the kernel's views, local disks. Anything
// else (fuse and fuse.*, nfs, cifs, 9p, ceph, overlay, which passes calls to
// the filesystems under it...) may.
constexpr const char* kLocalTypes[] = {
    "tmpfs",  "devtmpfs", "hugetlbfs", "ramfs", "proc",       "sysfs",   "devpts",
    "mqueue", "cgroup",   "cgroup2",   "bpf",   "securityfs", "debugfs", "tracefs",
    "pstore", "configfs", "efivarfs",  "ext2",  "ext3",       "ext4",    "xfs",
    "btrfs",  "vfat",     "exfat",     "f2fs",  "squashfs",   "iso9660", "nsfs",
};

// Reads what fits of `path` into `buffer` (NUL-terminated); the length, -1
// when it cannot be opened or read. No allocation: the reaper's threads call it.
ssize_t ReadSmall(const char* path, char* buffer, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t length = 0;
  while (length + 1 < size) {
    const ssize_t n = ::read(fd, buffer + length, size - 1 - length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    length += static_cast<size_t>(n);
  }
  ::close(fd);
  buffer[length] = '\0';
  return static_cast<ssize_t>(length);
}

// The mount id of `fd` in this thread's fd table, -1 when /proc cannot say.
// fdinfo prints what the kernel holds of the open file (position, flags,
// mount); FUSE, NFS and the like add nothing of theirs to it.
int MountIdOf(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/thread-self/fdinfo/%d", fd);
  char info[512];
  if (ReadSmall(path, info, sizeof(info)) <= 0) return -1;
  const char* at = std::strstr(info, "mnt_id:");
  if (at == nullptr) return -1;
  return static_cast<int>(std::strtol(at + 7, nullptr, 10));
}

// The kernel's own mounts, learned once from fds made for the purpose (-2:
// not yet; -1: could not tell): sockets, pipes, anonymous inodes (eventfd's
// mount is every anon_inode_getfile's), memfd (shmem's internal mount).
// The last two are memory (kMemfdMounts on): memfd's, and MFD_HUGETLB's.
std::atomic<int> g_kernel_mounts[5] = {-2, -2, -2, -2, -2};
constexpr int kFirstMemoryMount = 3;

void LearnKernelMounts() {
  if (g_kernel_mounts[0].load(std::memory_order_acquire) != -2) return;
  int learned[5] = {-1, -1, -1, -1, -1};
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
    learned[0] = MountIdOf(pair[0]);
    ::close(pair[0]);
    ::close(pair[1]);
  }
  if (::pipe2(pair, O_CLOEXEC) == 0) {
    learned[1] = MountIdOf(pair[0]);
    ::close(pair[0]);
    ::close(pair[1]);
  }
  if (const int fd = ::eventfd(0, EFD_CLOEXEC); fd >= 0) {
    learned[2] = MountIdOf(fd);
    ::close(fd);
  }
  if (const int fd = ::memfd_create("vmmipc-mount-probe", MFD_CLOEXEC); fd >= 0) {
    learned[3] = MountIdOf(fd);
    ::close(fd);
  }
  // No huge page is taken: the file is empty.
  if (const int fd = ::memfd_create("vmmipc-mount-probe", MFD_CLOEXEC | MFD_HUGETLB); fd >= 0) {
    learned[4] = MountIdOf(fd);
    ::close(fd);
  }
  // Only once the socket's is known: without a free fd now, try again later.
  if (learned[0] < 0) return;
  for (int i = 4; i >= 0; --i) g_kernel_mounts[i].store(learned[i], std::memory_order_release);
}

bool IsKernelMount(int mount) {
  LearnKernelMounts();
  for (const auto& known : g_kernel_mounts)
    if (known.load(std::memory_order_acquire) == mount) return true;
  return false;
}

// Whether mount `mount` is in this thread's mountinfo, its type then in
// `type`; kUntold when mountinfo cannot be read (no fd left, say). Reads in
// pieces, without allocating: a line is "id parent major:minor root point
// options [tags] - type source super-options".
enum class Listed { kYes, kNo, kUntold };
Listed ListedType(int mount, char* type, size_t size) {
  const int fd = ::open("/proc/thread-self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Listed::kUntold;
  char buffer[8192];
  size_t held = 0;
  bool found = false;
  bool eof = false;
  bool skipping = false;  // the rest of a line longer than the buffer
  while (!found) {
    if (!eof && held + 1 < sizeof(buffer)) {
      const ssize_t n = ::read(fd, buffer + held, sizeof(buffer) - 1 - held);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        eof = true;
      else
        held += static_cast<size_t>(n);
    }
    buffer[held] = '\0';
    char* end = static_cast<char*>(std::memchr(buffer, '\n', held));
    const bool full = end == nullptr && held + 1 >= sizeof(buffer);
    if (end == nullptr && !full) {
      if (eof) break;
      continue;
    }
    // A line, or the first 8 KiB of a longer one (its type comes early:
    // only the super options after it run long, an overlay's layers).
    size_t line = held;
    if (end != nullptr) {
      *end = '\0';
      line = static_cast<size_t>(end - buffer) + 1;
    }
    if (!skipping && std::strtol(buffer, nullptr, 10) == mount) {
      if (const char* dash = std::strstr(buffer, " - ")) {
        const char* from = dash + 3;
        size_t length = std::strcspn(from, " ");
        if (length >= size) length = size - 1;
        std::memcpy(type, from, length);
        type[length] = '\0';
        found = true;
      }
      break;
    }
    skipping = end == nullptr;
    std::memmove(buffer, buffer + line, held - line);
    held -= line;
  }
  ::close(fd);
  return found ? Listed::kYes : Listed::kNo;
}

}  // namespace

bool StatCached(int fd, CachedStat* out) noexcept {
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MODE | STATX_MNT_ID,
              &sx) != 0)
    return false;
  out->mode = sx.stx_mode;
  out->mount = (sx.stx_mask & STATX_MNT_ID) != 0 ? static_cast<int>(sx.stx_mnt_id) : -1;
  return true;
}

bool IsMemfdMount(int mount) noexcept {
  if (mount < 0) return false;
  LearnKernelMounts();
  for (int i = kFirstMemoryMount; i < 5; ++i)
    if (g_kernel_mounts[i].load(std::memory_order_acquire) == mount) return true;
  return false;
}

bool PlacesKnown() noexcept {
  LearnKernelMounts();
  return g_kernel_mounts[0].load(std::memory_order_acquire) >= 0;
}

FdPlace PlaceOf(int fd) noexcept {
  // Not knowing the kernel's own mounts (no fd left to learn them), a
  // socket's would read as a mount nobody lists.
  if (!PlacesKnown()) return FdPlace::kUntold;
  const int mount = MountIdOf(fd);
  if (mount < 0) return FdPlace::kUntold;
  if (IsKernelMount(mount)) return FdPlace::kKernel;
  char type[64];
  const Listed listed = ListedType(mount, type, sizeof(type));
  if (listed == Listed::kUntold) return FdPlace::kUntold;
  if (listed == Listed::kNo) return FdPlace::kUnlisted;
  for (const char* local : kLocalTypes)
    if (std::strcmp(type, local) == 0) return FdPlace::kLocal;
  return FdPlace::kListedMayWait;
}

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
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_PATH) != 0) return false;  // no file operations at all
  // A file of FUSE or NFS (a mount listed as such) is not asked anything:
  // its daemon may not answer.
  const FdPlace place = PlaceOf(fd);
  if (place == FdPlace::kListedMayWait) return true;
  CachedStat st;
  if (!StatCached(fd, &st)) return true;
  switch (st.mode & S_IFMT) {
    case S_IFREG:
    case S_IFDIR: {
      // A mount we cannot see (not the kernel's memfd one): as FUSE's.
      if (place == FdPlace::kUnlisted && !IsMemfdMount(st.mount)) return true;
      long type = 0;
      return !OnMemoryFilesystem(fd, &type);
    }
    default:
      return false;  // sockets, pipes, devices, anonymous inodes: no flush that waits on a peer
  }
}

bool CloseNeverWaits(int fd) {
  const FdPlace place = PlaceOf(fd);
  if (place == FdPlace::kListedMayWait) return false;
  CachedStat st;
  if (!StatCached(fd, &st)) return false;
  switch (st.mode & S_IFMT) {
    case S_IFREG: {
      if (place == FdPlace::kUnlisted && !IsMemfdMount(st.mount)) return false;
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
