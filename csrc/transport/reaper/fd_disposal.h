// Disposal of a descriptor a peer may have handed us, so that its last close
// cannot block: a socket's lingering is switched off first (its close then
// resets at once instead of waiting up to SO_LINGER's time for unsent data),
// and what a Unix socket still queues (messages with more fds, nested as deep
// as the kernel lets them be, or a listening socket's unaccepted
// connections) is taken out and disposed of the same way before the socket
// is closed. A file whose filesystem may wait on someone (fd_kind.h's
// PlaceOf: FUSE, NFS, a mount it cannot place) is neither looked at nor
// closed: it stays open in the private table. Runs only on the reaper's threads, in their private
// fd table (fd_reaper.h): in the host's table the fds taken out of queues would land there, and
// closing one of the host's own files there would drop the POSIX locks the host holds on it.
#pragma once

#include <cstddef>

namespace vmmipc::transport {

struct DisposalCounts {
  size_t closed = 0;           // fds closed, the one handed over included
  size_t sockets_defused = 0;  // sockets whose lingering was switched off
  size_t fds_dropped = 0;      // messages whose fds the kernel dropped (no room)
  size_t queues_left = 0;      // queues not emptied: deeper or longer than the bounds
  size_t kept_open = 0;        // files whose stat or close may wait: left open, never closed
};

// Takes `fd` apart and closes it. Never logs (a private table's fd numbers
// are not the host's: a log file's fd there would be someone else's file).
void DisposeOfPeerFd(int fd, DisposalCounts* counts) noexcept;

}  // namespace vmmipc::transport
