// Socket syscalls of the transport, each wait bounded. Sends and receives use
// MSG_DONTWAIT plus poll() rather than blocking calls with SO_RCVTIMEO, so that
// one deadline spans a whole exchange and a stop fd can interrupt any wait.
#include "transport/socket_io.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/syscall.h"

namespace vmmipc::transport {
namespace {

// How long to back off when the kernel refuses fds in flight (ETOOMANYREFS)
// or buffer memory (ENOBUFS): both clear as the peer drains its queue.
constexpr int kBackoffMs = 1;

IoResult FromErrno(int error) {
  switch (error) {
    case EPIPE:
    case ECONNRESET:
      return {IoStatus::kPeerClosed, error};
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return {IoStatus::kNoResources, error};
    default:
      return {IoStatus::kError, error};
  }
}

// Sleeps for up to `ms`, waking early on stop_fd; reports kTimeout/kStopped.
IoResult Backoff(int ms, const Deadline& deadline, int stop_fd) {
  if (deadline.Expired()) return {IoStatus::kTimeout, 0};
  const Deadline pause = Deadline::AfterMs(std::min(ms, deadline.RemainingMs()));
  pollfd pfd{stop_fd, POLLIN, 0};
  while (true) {
    int n = ::poll(&pfd, stop_fd >= 0 ? 1 : 0, pause.RemainingMs());
    if (n > 0) return {IoStatus::kStopped, 0};
    if (n == 0 || errno != EINTR) return {IoStatus::kOk, 0};
  }
}

// Closes every fd of every SCM_RIGHTS record, by adopting them into `out`.
void CollectFds(msghdr* msg, std::vector<ScopedFd>* out) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));  // CMSG_DATA may be unaligned
      out->emplace_back(fd);
    }
  }
}

}  // namespace

Deadline Deadline::AfterMs(int ms) {
  Deadline d;
  d.when_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(ms, 0));
  return d;
}

int Deadline::RemainingMs() const {
  const auto left = when_ - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<decltype(ms)>(ms, INT_MAX));
}

const char* IoStatusName(IoStatus status) {
  switch (status) {
    case IoStatus::kOk:
      return "ok";
    case IoStatus::kTimeout:
      return "timed out";
    case IoStatus::kStopped:
      return "stopped";
    case IoStatus::kPeerClosed:
      return "peer closed the connection";
    case IoStatus::kNoResources:
      return "out of resources";
    case IoStatus::kError:
      return "socket error";
  }
  return "unknown";
}

IoResult GetPeerCredentials(int fd, PeerCredentials* out) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return FromErrno(errno);
  out->pid = static_cast<uint32_t>(cred.pid);
  out->uid = cred.uid;
  out->gid = cred.gid;
  return {};
}

std::string PeerPidText(uint32_t pid) {
  return pid != 0 ? fmt::format("pid {}", pid) : "pid ? (outside this pid namespace)";
}

IoResult WaitFor(int fd, short events, const Deadline& deadline, int stop_fd) {
  pollfd pfds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
  const nfds_t count = stop_fd >= 0 ? 2 : 1;
  while (true) {
    const int remaining = deadline.RemainingMs();
    if (remaining == 0) return {IoStatus::kTimeout, 0};
    const int n = ::poll(pfds, count, remaining);
    if (n < 0) {
      if (errno == EINTR) continue;  // a signal for the host process: keep waiting
      return FromErrno(errno);
    }
    if (n == 0) continue;  // re-check the deadline (poll may wake a little early)
    if (count == 2 && pfds[1].revents != 0) return {IoStatus::kStopped, 0};
    if (pfds[0].revents != 0) return {};
  }
}

IoResult ConnectSeqpacket(const SocketAddress& address, const Deadline& deadline, ScopedFd* out) {
  // SOCK_SEQPACKET keeps message boundaries, so the fds of a batch always
  // arrive with that batch's entries (a stream socket would let them drift).
  ScopedFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) return FromErrno(errno);
  while (true) {
    const int remaining = deadline.RemainingMs();
    if (remaining == 0) return {IoStatus::kTimeout, 0};
    // A Unix connect blocks only while the listener's backlog is full, and
    // honours SO_SNDTIMEO for that wait (EAGAIN when it runs out), which
    // bounds it without a non-blocking connect dance.
    timeval tv{remaining / 1000, static_cast<suseconds_t>((remaining % 1000) * 1000)};
    if (::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
      return FromErrno(errno);
    }
    if (::connect(sock.get(), address.get(), address.length) == 0) break;
    // EINTR leaves a Unix socket unconnected, so connecting again is safe.
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return {IoStatus::kTimeout, EAGAIN};
    return FromErrno(errno);
  }
  *out = std::move(sock);
  return {};
}

IoResult SendMessage(int fd, std::span<const uint8_t> data, std::span<const int> fds,
                     const Deadline& deadline, int stop_fd) {
  if (fds.size() > kMaxFdsPerMessage) return {IoStatus::kError, EINVAL};
  iovec iov{const_cast<uint8_t*>(data.data()), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    // MSG_NOSIGNAL: a peer that hung up must give us EPIPE, never a SIGPIPE
    // that would kill the host process.
    const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      // SOCK_SEQPACKET sends a message whole or not at all.
      if (static_cast<size_t>(n) != data.size()) return {IoStatus::kError, EMSGSIZE};
      return {};
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      if (IoResult r = WaitFor(fd, POLLOUT, deadline, stop_fd); !r.ok()) return r;
      continue;
    }
    if (errno == ETOOMANYREFS || errno == ENOBUFS) {
      // ETOOMANYREFS: this user has more fds in flight than RLIMIT_NOFILE;
      // they leave flight as the client receives them, so wait, bounded.
      if (IoResult r = Backoff(kBackoffMs, deadline, stop_fd); !r.ok()) return r;
      continue;
    }
    return FromErrno(errno);
  }
}

namespace {

// A SOCK_SEQPACKET recvmsg can report EOF while a message is queued. The
// kernel looks at the queue (empty), then at the shutdown flag; a peer that
// queues its last message and shuts down between the two looks (the exporter
// answers, then closes) makes it return 0. Seen on an H200 host: one open in
// ~25,000 with 8 processes on one GPU failed "the exporter closed the
// connection" although the exporter had sent its answer. The peer's sends all
// come before its shutdown, so once the shutdown is visible a second look at
// the queue sees them: only a second 0 is the end. True once per call.
bool LookAgainAfterEof(bool* looked_again) {
  if (*looked_again) return false;
  *looked_again = true;
  return true;
}

}  // namespace

IoResult ReceiveMessage(int fd, std::span<uint8_t> buffer, ReceivedMessage* out,
                        const Deadline& deadline, int stop_fd) {
  *out = ReceivedMessage{};
  // Room for the kernel's maximum (SCM_MAX_FD), whatever the peer claims it
  // sends: a short control buffer would make the kernel drop fds silently.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  bool looked_again = false;
  while (true) {
    iovec iov{buffer.data(), buffer.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    // Try first, wait only when nothing is queued: after a PeekMessage the
    // message is there, and a poll first would be one more syscall per open.
    // MSG_CMSG_CLOEXEC: the received fds are CLOEXEC from birth, so a
    // concurrent fork+exec elsewhere in the host process cannot inherit them.
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return FromErrno(errno);
      if (IoResult r = WaitFor(fd, POLLIN, deadline, stop_fd); !r.ok()) return r;
      continue;
    }
    CollectFds(&msg, &out->fds);
    out->truncated = (msg.msg_flags & MSG_TRUNC) != 0;
    out->control_truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
    // We never send empty messages, so 0 bytes is the orderly shutdown (EOF),
    // once a second look agrees (LookAgainAfterEof).
    if (n == 0 && out->fds.empty() && LookAgainAfterEof(&looked_again)) continue;
    if (n == 0) return {IoStatus::kPeerClosed, 0};
    out->length = static_cast<size_t>(n);
    return {};
  }
}

IoResult PeekMessage(int fd, std::span<uint8_t> buffer, PeekedMessage* out,
                     const Deadline& deadline, int stop_fd) {
  *out = PeekedMessage{};
  bool looked_again = false;
  while (true) {
    // Try first, wait only when nothing is queued: with an expired deadline
    // this is one non-blocking look (the listener's poll thread uses that).
    iovec iov{buffer.data(), buffer.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    // No control buffer: attached fds stay in the kernel's queue, owned by
    // the message, and MSG_CTRUNC tells us they are there.
    const ssize_t n = ::recvmsg(fd, &msg, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return FromErrno(errno);
      if (IoResult r = WaitFor(fd, POLLIN, deadline, stop_fd); !r.ok()) return r;
      continue;
    }
    out->carries_fds = (msg.msg_flags & MSG_CTRUNC) != 0;
    out->truncated = (msg.msg_flags & MSG_TRUNC) != 0;
    if (n == 0 && !out->carries_fds && LookAgainAfterEof(&looked_again)) continue;
    if (n == 0 && !out->carries_fds) return {IoStatus::kPeerClosed, 0};
    out->length = static_cast<size_t>(n);
    return {};
  }
}

void DiscardPeekedMessage(int fd) {
  uint8_t byte = 0;
  iovec iov{&byte, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  (void)RetryOnEintr([&] { return ::recvmsg(fd, &msg, MSG_DONTWAIT); });
}

bool RefuseIncomingFds(int listen_fd) {
#ifndef SO_PASSRIGHTS
  constexpr int SO_PASSRIGHTS = 83;  // include/uapi/asm-generic/socket.h, Linux 6.16
#endif
  const int off = 0;
  return ::setsockopt(listen_fd, SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof(off)) == 0;
}

}  // namespace vmmipc::transport
