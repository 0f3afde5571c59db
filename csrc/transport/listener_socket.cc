// The listening socket's making: socket, a stale path cleared, fchmod before
// bind, bind, SO_PASSRIGHTS off, listen.
#include "transport/listener_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/log.h"
#include "common/syscall.h"
#include "transport/fd_channel.h"

namespace vmmipc::transport {
namespace {

constexpr int kBacklog = 256;

// Prepares a filesystem socket path: a socket file left by a dead process
// (connect is refused) is removed; a live one, or any other kind of file, is
// left alone and reported.
bool ClearStalePath(const SocketAddress& address, std::string* error) {
  struct stat st {};
  if (::lstat(address.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    *error = fmt::format("cannot inspect {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  if (!S_ISSOCK(st.st_mode)) {
    *error = fmt::format("{} exists and is not a socket; not removing it", address.path);
    return false;
  }
  ScopedFd probe;
  const IoResult io = ConnectSeqpacket(address, Deadline::AfterMs(100), &probe);
  if (io.ok() || io.status == IoStatus::kTimeout) {
    *error = fmt::format(
        "{} is in use by a live listener (same uid and pid in another pid "
        "namespace sharing this directory?)",
        address.path);
    return false;
  }
  if (io.error != ECONNREFUSED) {
    *error = fmt::format("{} exists and cannot be probed: {}", address.path, ErrnoText(io.error));
    return false;
  }
  // ECONNREFUSED: nobody listens; a previous process of this pid died without
  // unlinking. Its file would make bind() fail with EADDRINUSE.
  if (::unlink(address.path.c_str()) != 0 && errno != ENOENT) {
    *error = fmt::format("cannot remove stale socket {}: {}", address.path, ErrnoText(errno));
    return false;
  }
  VMMIPC_LOG_INFO("listener: removed stale socket file {}", address.path);
  return true;
}

bool Bind(const SocketAddress& address, int fd, std::string* error) {
  if (::bind(fd, address.get(), address.length) == 0) return true;
  const int e = errno;
  if (e == EADDRINUSE && address.abstract) {
    *error = fmt::format(
        "listener {}: the name is already bound by another process of this uid in this "
        "network namespace (a process of the same pid in another pid namespace?)",
        address.display);
  } else {
    *error = fmt::format("listener {}: bind: {}", address.display, ErrnoText(e));
  }
  return false;
}

}  // namespace

bool BindListeningSocket(const SocketAddress& address, ScopedFd* fd, BoundSocketFile* file,
                         std::string* error) {
  fd->Reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!*fd) {
    *error = fmt::format("listener {}: socket: {}", address.display, ErrnoText(errno));
    return false;
  }
  if (!address.abstract && !ClearStalePath(address, error)) return false;
  // The file bind() creates takes the socket's own mode (minus the umask):
  // set here, it is 0600 from birth. A chmod by path after bind would follow
  // a symlink swapped in meanwhile. The uid check is the real one anyway.
  if (!address.abstract && ::fchmod(fd->get(), 0600) != 0) {
    *error = fmt::format("listener {}: fchmod: {}", address.display, ErrnoText(errno));
    return false;
  }
  if (!Bind(address, fd->get(), error)) return false;
  // From here the file is removed at the listener's Stop() (its start's
  // failures included) and at the process's exit, while it is still the one bound.
  if (!address.abstract && !file->Adopt(address.path))
    VMMIPC_LOG_WARN(
        "listener {}: the socket file is not the one bind() made any more; it is left "
        "alone, at stop and at exit",
        address.display);
  // Nothing we are sent may carry fds: have the kernel refuse them outright
  // where it can (Linux 6.16+); elsewhere serve_connection never takes them.
  const bool refuses_fds = RefuseIncomingFds(fd->get());
  VMMIPC_LOG_DEBUG("listener {}: SO_PASSRIGHTS {}", address.display,
                   refuses_fds ? "off: the kernel refuses fds sent to us" : "not supported");
  if (::listen(fd->get(), kBacklog) != 0) {
    *error = fmt::format("listener {}: listen: {}", address.display, ErrnoText(errno));
    return false;
  }
  return true;
}

}  // namespace vmmipc::transport
