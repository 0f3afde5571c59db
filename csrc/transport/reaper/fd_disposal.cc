// Taking a peer's fd apart before its last close: SO_LINGER off, queues emptied.
#include "transport/reaper/fd_disposal.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "transport/reaper/fd_kind.h"
#include "transport/socket_io.h"

namespace vmmipc::transport {
namespace {

// The kernel refuses to pass a Unix socket whose queue holds sockets nested
// deeper than 4 levels (MAX_RECURSION_LEVEL in net/unix); two more cover a
// listening socket's connections at any of those levels.
constexpr int kMaxDepth = 6;
// A queue is bounded by its sender's buffer: a few hundred messages at the
// default and at net.core.wmem_max. A peer that forced a larger one gets
// this many taken out, and the rest go with the socket's close (which then
// may wait, on this thread only).
constexpr int kMaxMessagesPerQueue = 1024;
constexpr int kMaxConnectionsPerListener = 4096;

void Dispose(int fd, int depth, DisposalCounts* counts);

void EmptyQueue(int fd, int depth, DisposalCounts* counts) {
  int type = 0;
  socklen_t length = sizeof(type);
  ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length);
  // A SOCK_SEQPACKET socket's end reads as 0 bytes, and so does a
  // zero-length message, which may be followed by more (with fds); no flag
  // nor SIOCINQ (a byte count) tells them apart. With SO_PASSCRED every
  // message comes with the sender's credentials, and the end with none.
  const int on = 1;
  const bool marked = ::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) == 0;
  // After the shutdown the peer can queue nothing more: what is read below
  // is all there will be.
  ::shutdown(fd, SHUT_RDWR);
  for (int message = 0; message < kMaxMessagesPerQueue; ++message) {
    char data[4096];
    iovec iov{data, sizeof(data)};
    alignas(cmsghdr) char
        control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: empty; anything else: nothing more to take
    if ((msg.msg_flags & MSG_CTRUNC) != 0) ++counts->fds_dropped;
    bool had_fds = false;
    bool a_message = n > 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      a_message = true;  // credentials or fds: something was queued
      if (c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (size_t i = 0; i < count; ++i) Dispose(fds[i], depth + 1, counts);
      had_fds = had_fds || count > 0;
    }
    // The end: a stream's 0, or a message-less 0 where messages are marked.
    // Unmarked (SO_PASSCRED refused), the queue is read to the bound.
    if (!a_message && (type == SOCK_STREAM || marked)) return;
  }
  ++counts->queues_left;
}

void AcceptAll(int fd, int depth, DisposalCounts* counts) {
  // Non-blocking: another holder of this listening socket may take a
  // connection between our look and our accept.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    ++counts->queues_left;
    return;
  }
  for (int i = 0; i < kMaxConnectionsPerListener; ++i) {
    const int connection = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0 && errno == EINTR) continue;
    if (connection < 0) return;
    Dispose(connection, depth + 1, counts);
  }
  ++counts->queues_left;
}

void Dispose(int fd, int depth, DisposalCounts* counts) {
  // A socket first, by a call only sockets answer (any other file is
  // ENOTSOCK, its filesystem never asked): most of what comes here is one.
  int socket_type = 0;
  socklen_t type_length = sizeof(socket_type);
  const bool socket = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &socket_type, &type_length) == 0;
  // Anything else is placed before anything looks at it (fd_kind.h): a
  // file whose filesystem may wait on someone (FUSE, NFS, a mount of another
  // mount namespace) is neither stat'ed nor closed, since either may wait
  // for its daemon for ever (before, every reaper thread could be kept so,
  // issue 44). It stays open in this table, which is not the host's; the
  // table's RLIMIT_NOFILE bounds them, past which the kernel drops the fds a
  // message carries itself, without the flush that waits.
  if (!socket && PlacesKnown() && !StatNeverWaits(PlaceOf(fd))) {
    ++counts->kept_open;
    return;
  }
  if (socket) {
    // Linger on with a zero time: the last close aborts the connection
    // (a reset for TCP) instead of waiting for unsent data to be acked.
    const linger abort_at_close{1, 0};
    if (::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_at_close, sizeof(abort_at_close)) == 0) {
      ++counts->sockets_defused;
    }
    int domain = 0;
    socklen_t length = sizeof(domain);
    if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) == 0 && domain == AF_UNIX) {
      if (depth >= kMaxDepth) {
        ++counts->queues_left;
      } else {
        int listening = 0;
        length = sizeof(listening);
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length);
        if (listening != 0) {
          AcceptAll(fd, depth, counts);
        } else {
          EmptyQueue(fd, depth, counts);
        }
      }
    }
  }
  ::close(fd);
  ++counts->closed;
}

}  // namespace

void DisposeOfPeerFd(int fd, DisposalCounts* counts) noexcept {
  if (fd < 0) return;
  Dispose(fd, 0, counts);
}

}  // namespace vmmipc::transport
