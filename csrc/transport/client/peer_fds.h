// What an importer does with the fds an exporter sent: it checks that each is
// of a kind the driver's shareable handles are before anything else touches
// it, and hands every fd it will not use to the reaper, so that no close of a
// peer's fd happens on the application's thread or the follow thread (a
// socket's last close may wait for its linger time; see fd_reaper.h).
#pragma once

#include <string>
#include <vector>

#include "common/scoped_fd.h"

namespace vmmipc::transport {

// True when `fd` may be device memory: a regular file (the simulated
// driver's memfd), a character device that is not a terminal, or an
// anonymous-inode file. Sockets, FIFOs, directories, block devices,
// terminals and O_PATH fds are not; `why` then says what it is.
bool IsMemoryFdKind(int fd, std::string* why);

// The same for each fd; `why` names the first that is not, by its index.
bool AllMemoryFdKinds(const std::vector<ScopedFd>& fds, std::string* why);

// Hands every valid fd of `fds` to the reaper; leaves `fds` empty.
void HandToReaper(std::vector<ScopedFd>* fds) noexcept;

}  // namespace vmmipc::transport
