// What an importer does with the fds an exporter sent: it checks that each is
// of a kind the driver's shareable handles are before anything else touches
// it, and hands every fd it will not use to the reaper, so that no close of a
// peer's fd happens on the application's thread or the follow thread (a
// socket's last close may wait for its linger time; see fd_reaper.h). An fd
// whose every close may wait, not only its last (a regular file of FUSE or
// NFS: its flush), is not even handed over, since the hand-over closes the
// host's copy: it is kept open (KeepOpen).
#pragma once

#include <string>
#include <vector>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

// True when `fd` may be device memory: a regular file of a memory filesystem
// (tmpfs or hugetlbfs: the simulated driver's memfd), a character device
// that is not a terminal (the driver's, /dev/nvidiactl), or an
// anonymous-inode file. Sockets, FIFOs, directories, block devices,
// terminals, O_PATH fds and files of any other filesystem (FUSE, NFS, disks)
// are not; `why` then says what it is. Looks only at the fd's inode and
// filesystem (fstat, fstatfs, F_GETFL, TCGETS): nothing that reaches a FUSE
// daemon or a server.
bool IsMemoryFdKind(int fd, std::string* why);

// The same for each fd; `why` names the first that is not, by its index.
bool AllMemoryFdKinds(const std::vector<ScopedFd>& fds, std::string* why);

// Hands every valid fd of `fds` to the reaper, or keeps it open where its
// every close may wait (KeepOpen, fd_reaper.h); leaves `fds` empty.
void HandToReaper(std::vector<ScopedFd>* fds) noexcept;

}  // namespace vmmipc::transport
