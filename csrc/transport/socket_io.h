// The socket primitives of the transport: deadlines, a bounded connect, peer
// credentials, and one-message send/receive with fds riding as SCM_RIGHTS.
// Every wait here is bounded by a Deadline and can be cut short by a stop fd;
// nothing here knows the protocol's records (wire.h) or who is on the other side.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/socket_address.h"

namespace vmmipc::transport {

// The kernel's SCM_MAX_FD: the most fds one sendmsg may carry (more: EINVAL).
inline constexpr size_t kMaxFdsPerMessage = 253;

class Deadline {
 public:
  // Negative values count as 0: already expired.
  static Deadline AfterMs(int ms);
  // Milliseconds left, rounded up (so a poll never spins at 0 before the end).
  int RemainingMs() const;
  bool Expired() const { return RemainingMs() == 0; }

 private:
  std::chrono::steady_clock::time_point when_;
};

enum class IoStatus {
  kOk = 0,
  kTimeout,      // the deadline passed
  kStopped,      // the stop fd became readable
  kPeerClosed,   // EOF, EPIPE, ECONNRESET: the other side is gone
  kNoResources,  // EMFILE, ENFILE, ENOMEM
  kError,        // any other errno (in IoResult::error)
};
const char* IoStatusName(IoStatus status);

struct IoResult {
  IoStatus status = IoStatus::kOk;
  int error = 0;  // errno behind the status, when there was one
  bool ok() const { return status == IoStatus::kOk; }
};

struct PeerCredentials {
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};
// SO_PEERCRED: the peer's credentials as the kernel recorded them at connect()
// (for the client: at the server's listen()), in this process's namespaces.
IoResult GetPeerCredentials(int fd, PeerCredentials* out);
// A peer's pid for log lines: "pid 123"; SO_PEERCRED's pid 0, a process
// outside this process's pid namespace (a host process, to a listener in a
// container), reads "pid ? (outside this pid namespace)". Nothing in the
// protocol uses the pid: it only tells people which process it was.
std::string PeerPidText(uint32_t pid);

// Waits until `fd` reports one of `events` (or an error/hangup), the deadline
// passes, or `stop_fd` (if >= 0) becomes readable.
IoResult WaitFor(int fd, short events, const Deadline& deadline, int stop_fd = -1);

// A CLOEXEC SOCK_SEQPACKET socket connected to `address`. A full listen
// backlog is waited out until the deadline (kTimeout). Refused or missing
// names come back as kError with ECONNREFUSED or ENOENT.
IoResult ConnectSeqpacket(const SocketAddress& address, const Deadline& deadline, ScopedFd* out);

// Sends one message (all of `data`) with `fds` attached. The fds stay owned
// by the caller (the kernel takes its own references).
IoResult SendMessage(int fd, std::span<const uint8_t> data, std::span<const int> fds,
                     const Deadline& deadline, int stop_fd = -1);

struct ReceivedMessage {
  size_t length = 0;               // bytes stored in the buffer
  bool truncated = false;          // MSG_TRUNC: the message was longer than the buffer
  bool control_truncated = false;  // MSG_CTRUNC: some attached fds were dropped by the kernel
  std::vector<ScopedFd> fds;       // every fd that did arrive (CLOEXEC), whatever else happened
};
// Receives one message. The control buffer always has room for the kernel's
// maximum of fds per message, so control_truncated can only mean the kernel
// could not install an fd here (out of fds, or a security module refused it).
IoResult ReceiveMessage(int fd, std::span<uint8_t> buffer, ReceivedMessage* out,
                        const Deadline& deadline, int stop_fd = -1);

// Looks at the next message without taking it and without installing any fd
// it carries (no control buffer: the kernel keeps them queued). `carries_fds`
// is set when it has some (MSG_CTRUNC). Waits like ReceiveMessage; an empty
// queue after the peer's shutdown is kPeerClosed.
struct PeekedMessage {
  size_t length = 0;
  bool truncated = false;
  bool carries_fds = false;
};
IoResult PeekMessage(int fd, std::span<uint8_t> buffer, PeekedMessage* out,
                     const Deadline& deadline, int stop_fd = -1);
// Takes the next message, already peeked and known to carry no fds, off the
// queue without a control buffer (so no fd can be installed even so).
void DiscardPeekedMessage(int fd);

// Asks the kernel to refuse SCM_RIGHTS sent to `listen_fd` and the
// connections accepted from it (SO_PASSRIGHTS = 0, Linux 6.16 and later):
// the sender's sendmsg fails with EPERM and no fd ever reaches us. False
// where the kernel does not know the option.
bool RefuseIncomingFds(int listen_fd);

}  // namespace vmmipc::transport
