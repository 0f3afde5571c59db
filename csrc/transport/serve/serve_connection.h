// The exporter's side of one exchange, in two phases so that one thread can
// watch many connections at once:
//  - reading (ReadRequest, on the listener's poll thread, never blocking):
//    peer credentials, then the request, looked at without taking any fd it
//    carries, checked (uid first, then fds, size and MAC) and only then
//    consumed; refusals are answered here;
//  - answering: the handler (PrepareReply), then the MAC'd reply batches with
//    their fds (SendReply). The listener does both on its poll thread when
//    the reply is one message, and hands longer replies to a worker, whose
//    sends may wait on a slow reader.
// Connections that may still hold a peer's fds are closed through
// CloseConnection (fd_reaper.h), never by a plain close() here.
// ServeConnection runs both phases on the calling thread (tests, fuzzing).
#pragma once

#include <cstdint>
#include <string>

#include "common/scoped_fd.h"
#include "common/timeout.h"
#include "transport/serve/serve_handler.h"
#include "transport/serve/watch/watchers.h"
#include "transport/siphash.h"
#include "transport/socket_io.h"
#include "transport/wire.h"

namespace vmmipc::transport {

struct ServeContext {
  SipKey secret;     // the exporter's secret: each request's key is KeyFor(secret, fields)
  uint32_t uid = 0;  // the only uid served (this process's euid)
  Timeout timeout;   // receiving the request; then, afresh, sending the reply
  int stop_fd = -1;  // readable when the listener stops: abandon the connection
  const ServeHandler* handler = nullptr;
  std::string name;  // the listener's address, for log lines
  ListenerEvents events;
  // Where a served request with kRequestFlagWatch leaves its connection;
  // nullptr: the exporter keeps none (not following), the connection closes.
  Watchers* watchers = nullptr;
};

// How long a peer of another uid may take to show its request. Such a peer is
// never one of our importers (socket names carry the uid), so it gets a short
// grace, only enough for its kWrongUser answer, rather than the full timeout.
inline constexpr int kOtherUserGraceMs = 50;

// How long the listener keeps an idle connection of one of our importers
// after its reply, for that importer's next request (warm connections,
// docs/protocol.md): long enough to span a burst of registrations and the
// gaps between an engine's opens, short enough that a gone importer's
// connection does not hold an fd of ours for long.
inline constexpr int kKeptIdleMs = 30000;

// An accepted connection waiting for its request: a new one, or one kept
// after an earlier reply (`kept`), which may wait kKeptIdleMs for its next
// request and goes quietly when its importer hangs up or lets it idle.
struct Connection {
  ScopedFd fd;
  PeerCredentials peer;
  Deadline deadline = Deadline::AfterMs(0);  // when a silent peer is dropped
  bool kept = false;
};

// An authenticated request, consumed from its connection, for the handler.
struct PendingRequest {
  ScopedFd fd;
  PeerCredentials peer;
  wire::Nonce nonce{};
  SipKey key;  // of the handle the request named: MACs every answer to it
  ServeRequest request;
  // A watch request's watcher, reserved before it is served (watchers.h).
  Watchers::Reservation watcher;
  // Came on a kept connection: a one-message reply on it is sent without
  // waiting (a peer that queued requests without reading the replies loses
  // the connection); a longer one, a worker's, waits as on a new one.
  bool kept = false;
};

// Reads the peer's credentials and sets the request deadline. False (the
// connection is dropped, logged and counted) when the kernel cannot tell.
bool StartConnection(ScopedFd fd, const ServeContext& context, Connection* out) noexcept;

enum class ReadOutcome {
  kWaiting,  // no request queued yet: poll again
  kReady,    // *out holds an authenticated request; the connection moved into it
  kDone,     // refused or dropped, with one log line; the connection is closed
};
// Looks at the queued request of `connection` without waiting.
ReadOutcome ReadRequest(Connection& connection, const ServeContext& context,
                        PendingRequest* out) noexcept;
// The deadline of `connection` passed without a request: drop it (logged, counted).
void DropSilent(Connection connection, const ServeContext& context) noexcept;
// `connection` would wait for its request, and its class of connections is
// at its cap (admission.h, fd_budget.h): closed at once, without an answer,
// logged with `why`, counted as dropped.
void DropOverCap(Connection connection, const ServeContext& context,
                 const std::string& why) noexcept;
// Runs the handler and checks its reply. False when a refusal was sent
// instead (the connection is then closed); true: send `*reply` with SendReply.
bool PrepareReply(PendingRequest& request, const ServeContext& context, ServeReply* reply) noexcept;
// Refuses an authenticated request that is not answered after all (the
// listener is busy: its queue for the workers is full): `reason` sent,
// logged with `why` (rate-limited), the connection closed. The caller
// closes the reply's fds.
void RefuseRequest(PendingRequest request, RefuseReason reason, const std::string& why,
                   const ServeContext& context) noexcept;
// Sends the reply's batches with their fds, then closes the connection, or
// keeps it as a watch connection (the request asked, the context has watchers).
// The reply's fds stay the caller's: they close when it drops the reply (a
// listener worker keeps it where a forked child can find it meanwhile).
void SendReply(PendingRequest request, const ServeReply& reply,
               const ServeContext& context) noexcept;
// SendReply, but a connection whose reply went out whole and that no watcher
// took is returned instead of closed: the listener may keep it for its
// importer's next request (an invalid fd otherwise).
ScopedFd SendReplyKeeping(PendingRequest request, const ServeReply& reply,
                          const ServeContext& context) noexcept;
// A kept connection that idled past its bound or whose importer hung up:
// closed without a warning (an importer lets its kept connections go at will).
void CloseKept(Connection connection, const ServeContext& context) noexcept;
// True when the reply goes in one message: on a fresh connection whose peer
// has read nothing yet, that send never waits (the socket buffer holds it).
bool ReplyFitsOneMessage(const ServeReply& reply) noexcept;
// PrepareReply, then SendReply.
void AnswerRequest(PendingRequest request, const ServeContext& context) noexcept;

// Serves `connection` to the end on this thread and closes it. Never throws;
// every refusal is logged with the peer, the address and the reason.
void ServeConnection(ScopedFd connection, const ServeContext& context) noexcept;

}  // namespace vmmipc::transport
