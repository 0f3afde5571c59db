// Which closes of an fd a peer sent can wait, told from the fd's place, then
// its inode and filesystem (fstat, fstatfs, F_GETFL, TCGETS) only where
// those never reach a FUSE daemon or a server. Every close of a regular file of FUSE or NFS may
// wait (its flush: FUSE's waits for its daemon for ever); the last close of a
// socket may (its linger time, or the fds its queue holds), and of a
// terminal (its output draining). The importer's kind check
// (client/peer_fds.h) and the reaper's last resort (fd_reaper.h) ask here.
//
// Where an fd's file lives is told without calling into its filesystem at
// all (PlaceOf): fstat and fstatfs of a FUSE file ask its daemon (GETATTR,
// STATFS) whenever its attributes are not cached, and a daemon that never
// answers keeps the caller for ever (issue 44: every reaper thread stuck
// there). The mount id in /proc/thread-self/fdinfo is compared with the
// kernel's own mounts (sockets, pipes, anonymous inodes, memfd: learned from
// fds made for the purpose) and with /proc/thread-self/mountinfo's types;
// only an fd whose place cannot wait is looked at further.
#pragma once

namespace vmmipc::transport {

enum class FdPlace {
  kUntold,         // /proc cannot say (not mounted, or no fd left to read it)
  kKernel,         // a mount of the kernel's own: a socket, a pipe, an anonymous inode, a memfd
  kLocal,          // a mount listed in mountinfo whose type never waits on anyone (tmpfs, ext4...)
  kListedMayWait,  // a listed mount of another type: FUSE, NFS, CIFS, 9p, overlay...
  kUnlisted,       // a mount neither listed nor the kernel's own that we know: a mount of
                   // another mount namespace (a FUSE mount of unshare -Urm), or an internal one
};
// Where `fd`'s file lives; looks at /proc only (in the calling thread's fd
// table: /proc/thread-self), never at the file.
FdPlace PlaceOf(int fd) noexcept;
// What the kernel holds of `fd`'s inode, asked without a round trip to its
// filesystem's daemon or server (statx with AT_STATX_DONT_SYNC, which FUSE,
// NFS, CIFS and Ceph answer from their cache): its type and mode, and its
// mount id (-1 where the kernel does not give it, before Linux 5.8). False
// when statx fails.
struct CachedStat {
  unsigned mode = 0;
  int mount = -1;
};
bool StatCached(int fd, CachedStat* out) noexcept;
// Whether `mount` is the kernel's own mount of memfd's memory (shmem's, or
// hugetlbfs's for MFD_HUGETLB).
bool IsMemfdMount(int mount) noexcept;
// Whether /proc tells places at all (false where it is not mounted: callers
// then look at the file itself, as before).
bool PlacesKnown() noexcept;
// Whether fstat and fstatfs of a file in `place` never call into a
// filesystem that may wait on a peer.
inline bool StatNeverWaits(FdPlace place) {
  return place == FdPlace::kKernel || place == FdPlace::kLocal;
}

// Whether `fd` is a regular file of a filesystem whose files are memory and
// nothing else (tmpfs, shmem: memfd_create; hugetlbfs). `*type`: the
// filesystem's magic number, -1 when fstatfs fails.
bool OnMemoryFilesystem(int fd, long* type);

// Whether every close of `fd` may wait, not only its last: a regular file or
// a directory of a filesystem that is not memory, a file of a listed mount
// that may wait (never stat'ed), or what fstat cannot tell.
bool EveryCloseMayWait(int fd);

// Whether no close of `fd`, the last included, can wait on anyone: a file of
// a memory filesystem, an anonymous inode, a pipe, a character device that is
// not a terminal. False without a stat for a file of a listed mount that may
// wait.
bool CloseNeverWaits(int fd);

}  // namespace vmmipc::transport
