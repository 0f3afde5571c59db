// A thread's own fd table: the calling thread leaves the process's shared
// table for an empty one of its own (close_range with CLOSE_RANGE_UNSHARE)
// and takes a copy of one of the host's fds into it (pidfd_getfd on its own
// process). What the reaper's threads dispose of there never enters the
// host's table (fd_reaper.h). Linux 5.9 and later; a seccomp policy may
// refuse any of the three calls, which is probed before there is no way back.
#pragma once

namespace vmmipc::transport {

// Moves the calling thread into a fd table of its own and returns its copy of
// `fd` there, or -1: still in the host's table unless `*unshared` says
// otherwise (then the thread has a table of its own without `fd` in it).
// Probed in the host's table first, since after the unshare there is no way
// back. Fds 0, 1 and 2 of the new table are /dev/null, so that nothing lands
// on the stdio numbers.
int EnterPrivateFdTable(int fd, bool* unshared);

}  // namespace vmmipc::transport
