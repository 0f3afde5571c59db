// Which closes of an fd a peer sent can wait, told from the fd's inode and
// filesystem alone (fstat, fstatfs, F_GETFL, TCGETS: nothing that reaches a
// FUSE daemon or a server). Every close of a regular file of FUSE or NFS may
// wait (its flush: FUSE's waits for its daemon for ever); the last close of a
// socket may (its linger time, or the fds its queue holds), and of a
// terminal (its output draining). The importer's kind check
// (client/peer_fds.h) and the reaper's last resort (fd_reaper.h) ask here.
#pragma once

namespace vmmipc::transport {

// Whether `fd` is a regular file of a filesystem whose files are memory and
// nothing else (tmpfs, shmem: memfd_create; hugetlbfs). `*type`: the
// filesystem's magic number, -1 when fstatfs fails.
bool OnMemoryFilesystem(int fd, long* type);

// Whether every close of `fd` may wait, not only its last: a regular file or
// a directory of a filesystem that is not memory, or what fstat cannot tell.
bool EveryCloseMayWait(int fd);

// Whether no close of `fd`, the last included, can wait on anyone: a file of
// a memory filesystem, an anonymous inode, a pipe, a character device that is
// not a terminal.
bool CloseNeverWaits(int fd);

}  // namespace vmmipc::transport
