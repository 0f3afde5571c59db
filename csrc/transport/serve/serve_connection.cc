// One connection, served in order: credentials, request (looked at before it
// is taken, so that no fd of an unchecked peer ever enters our table),
// checks, handler, reply batches. Every failure ends in a refusal (when the
// peer can be told) or a dropped connection, with one log line, rate-limited
// so that a flood of hostile connections cannot flood the host's stderr; no
// exception leaves this file.
#include "transport/serve/serve_connection.h"

#include <poll.h>

#include <algorithm>
#include <exception>

#include "common/log.h"
#include "common/log_limit.h"
#include "common/syscall.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/serve/grant_check.h"

namespace vmmipc::transport {
namespace {

static_assert(wire::kMaxChunksPerBatch <= kMaxFdsPerMessage, "a batch's fds must fit one message");

// Generous for a v1 request (64 bytes); a longer one arrives truncated and
// is refused as kBadRequest, its preamble still readable for the reply.
constexpr size_t kRequestBufferSize = 512;
// How long a refusal may take to send from the poll thread: the peer's queue
// is empty at that point (a refusal is the first thing we send), so it goes
// at once unless something is very wrong.
constexpr int kRefusalSendMs = 50;

// Refusal and drop lines: a flood of connections (another user's, say) must
// not flood the host's log (common/log_limit.h).
log::LineLimit g_refusal_lines;

// True when this refusal or drop may be logged.
bool MayLog(const std::string& name) {
  return log::Enabled(log::Level::kWarn) &&
         log::Admitted(g_refusal_lines, log::Level::kWarn, "listener " + name,
                       "refusals and dropped connections");
}

void Dropped(const ServeContext& context) {
  if (context.events.dropped != nullptr) context.events.dropped();
}

void Close(ScopedFd fd, const ServeContext& context) {
  if (CloseConnection(std::move(fd)) && context.events.reaped != nullptr) context.events.reaped();
}

void SendRefusal(int fd, const ServeContext& context, const SipKey& key,
                 const PeerCredentials& peer, const wire::Nonce& nonce, uint64_t address,
                 RefuseReason reason, const std::string& why, int send_ms) {
  if (context.events.refused != nullptr) context.events.refused(reason);
  if (MayLog(context.name))
    VMMIPC_LOG_WARN("listener {}: refused peer {} uid {} for address {:#x}: {} ({})", context.name,
                    PeerPidText(peer.pid), peer.uid, address, RefuseReasonName(reason), why);
  wire::ReplyHeader header;
  header.status = static_cast<uint16_t>(reason);
  header.total_chunks = 0;
  header.batch_index = 0;
  header.batch_count = 1;
  const std::vector<uint8_t> bytes = wire::EncodeReply(nonce, key, header, {});
  if (IoResult io = SendMessage(fd, bytes, {}, Deadline::AfterMs(send_ms), context.stop_fd);
      !io.ok()) {
    VMMIPC_LOG_DEBUG("listener {}: refusal to {} not delivered: {}", context.name,
                     PeerPidText(peer.pid), IoStatusName(io.status));
  }
}

// True when every batch was sent.
bool SendGrants(const PendingRequest& p, const ServeContext& context, const ServeReply& reply) {
  const std::vector<ChunkGrant>& chunks = reply.chunks;
  const size_t all = chunks.size();
  const uint32_t total = static_cast<uint32_t>(all);
  const uint32_t batches = wire::BatchCount(total);
  // A fresh deadline: the handler's time (exporting chunks) is not the peer's
  // fault. The reply's own, not its connection's: a one-message reply on a
  // kept connection gets none, since an importer reads each reply before its
  // next request, so the queue is empty unless the peer does not read, and
  // the poll thread that sends it must not wait on such a peer; a longer
  // reply is a worker's (listener.h), whose sends wait for an importer that
  // reads at its own pace (descheduled between batches, say) as on a new
  // connection. Before, a multi-batch reply on a kept connection failed as
  // soon as the importer was a socket buffer behind (issue 44).
  const bool waits = !p.kept || batches > 1;
  const Deadline deadline = Deadline::AfterMs(waits ? context.timeout.ms() : 0);
  std::vector<wire::ReplyEntry> entries;
  std::vector<int> fds;
  for (uint32_t batch = 0; batch < batches; ++batch) {
    const size_t begin = size_t{batch} * wire::kMaxChunksPerBatch;
    const size_t end = std::min(all, begin + wire::kMaxChunksPerBatch);
    entries.clear();
    fds.clear();
    for (size_t i = begin; i < end; ++i) {
      const ChunkGrant& c = chunks[i];
      entries.push_back({c.address, c.size, c.generation});
      fds.push_back(c.fd.get());
    }
    wire::ReplyHeader header;
    header.status = 0;
    header.total_chunks = total;
    header.batch_index = batch;
    header.batch_count = batches;
    const std::vector<uint8_t> bytes = wire::EncodeReply(p.nonce, p.key, header, entries);
    if (IoResult io = SendMessage(p.fd.get(), bytes, fds, deadline, context.stop_fd); !io.ok()) {
      VMMIPC_LOG_WARN("listener {}: sending batch {} of {} to peer {} failed: {} ({})",
                      context.name, batch, batches, PeerPidText(p.peer.pid),
                      IoStatusName(io.status), io.error != 0 ? ErrnoText(io.error) : "no errno");
      return false;
    }
  }
  if (context.events.granted != nullptr) context.events.granted(total);
  VMMIPC_LOG_DEBUG("listener {}: granted {} chunks in {} batches to peer {} for address {:#x}",
                   context.name, total, batches, PeerPidText(p.peer.pid), p.request.address);
  return true;
}

// The checks of a request whose preamble parsed, in order; kNone when it is
// ours to serve, `*request` then parsed and its MAC verified. The uid check
// comes before anything else is looked at: another user gets nothing but
// this refusal, whatever it sent, and its message (with any fd it carries)
// is never taken off the queue.
RefuseReason CheckRequest(const Connection& c, const ServeContext& context,
                          const PeekedMessage& message, std::span<const uint8_t> bytes,
                          const wire::RequestPreamble& preamble, wire::Request* request,
                          std::string* why) {
  if (c.peer.uid != context.uid) {
    *why = fmt::format("peer uid {} is not this process's uid {}", c.peer.uid, context.uid);
    return RefuseReason::kWrongUser;
  }
  if (message.carries_fds) {
    *why = "the request carried fds";
    return RefuseReason::kBadRequest;
  }
  if (message.truncated) {
    *why = fmt::format("request longer than {} bytes", kRequestBufferSize);
    return RefuseReason::kBadRequest;
  }
  const wire::WireError parsed = wire::ParseRequest(bytes, context.secret, request);
  if (parsed == wire::WireError::kBadMac) {
    *why = fmt::format(
        "request MAC does not verify for pid {}: the handle is not one "
        "this process made (stale after pid reuse, or edited or forged)",
        preamble.exporter_pid);
    return RefuseReason::kBadToken;
  }
  if (parsed != wire::WireError::kOk) {
    *why = fmt::format("request version {}, {} bytes: {}", preamble.version, message.length,
                       wire::WireErrorName(parsed));
    return RefuseReason::kBadRequest;
  }
  return RefuseReason::kNone;
}

ReadOutcome Read(Connection& c, const ServeContext& context, PendingRequest* out) {
  std::vector<uint8_t> buffer(kRequestBufferSize);
  PeekedMessage message;
  const IoResult io = PeekMessage(c.fd.get(), buffer, &message, Deadline::AfterMs(0));
  if (io.status == IoStatus::kTimeout) return ReadOutcome::kWaiting;
  if (!io.ok() && c.kept && io.status == IoStatus::kPeerClosed) {
    CloseKept(std::move(c), context);  // its importer let it go: nothing to report
    return ReadOutcome::kDone;
  }
  if (!io.ok()) {
    if (MayLog(context.name))
      VMMIPC_LOG_WARN("listener {}: dropped peer {} uid {}: no request ({}{})", context.name,
                      PeerPidText(c.peer.pid), c.peer.uid, IoStatusName(io.status),
                      io.error != 0 ? fmt::format(": {}", ErrnoText(io.error)) : std::string());
    Dropped(context);
    Close(std::move(c.fd), context);
    return ReadOutcome::kDone;
  }
  // A message without fds is taken off the queue now, whoever sent it, so
  // that our close does not reset the connection before the peer has read
  // our answer (the kernel resets a peer whose message was never read). One
  // with fds stays queued: taking it would install them (or, without a
  // control buffer, make this thread do their last close); the reaper closes
  // the connection, and the peer sees a reset.
  if (!message.carries_fds) DiscardPeekedMessage(c.fd.get());
  const std::span<const uint8_t> bytes(buffer.data(), message.length);
  wire::RequestPreamble preamble;
  if (wire::WireError e = wire::ParseRequestPreamble(bytes, &preamble); e != wire::WireError::kOk) {
    // Without a preamble there is no nonce to MAC a refusal with: just hang up.
    if (MayLog(context.name))
      VMMIPC_LOG_WARN("listener {}: dropped peer {} uid {}: not a vmmipc request ({}{})",
                      context.name, PeerPidText(c.peer.pid), c.peer.uid, wire::WireErrorName(e),
                      message.carries_fds ? ", with fds attached" : "");
    Dropped(context);
    Close(std::move(c.fd), context);
    return ReadOutcome::kDone;
  }
  // What the request claims to name, unverified: the address for log lines,
  // and the key of a refusal, so that a holder of that handle can verify it
  // (a request of no known layout gets a key nobody holds).
  wire::Request claimed;
  const bool readable = wire::PeekRequestFields(bytes, &claimed);
  const uint64_t address = readable ? claimed.handle.address : 0;
  const SipKey key = readable ? wire::KeyFor(context.secret, claimed.handle)
                              : wire::DeriveKey(0, preamble.exporter_pid);
  wire::Request request;
  std::string why;
  if (RefuseReason reason = CheckRequest(c, context, message, bytes, preamble, &request, &why);
      reason != RefuseReason::kNone) {
    SendRefusal(c.fd.get(), context, key, c.peer, preamble.nonce, address, reason, why,
                std::min(context.timeout.ms(), kRefusalSendMs));
    Close(std::move(c.fd), context);
    return ReadOutcome::kDone;
  }
  out->fd = std::move(c.fd);
  out->peer = c.peer;
  out->nonce = preamble.nonce;
  out->key = key;  // verified: the key of the handle the request named
  out->request.peer_pid = c.peer.pid;
  out->request.peer_uid = c.peer.uid;
  out->request.address = request.handle.address;
  out->request.chunk_base = request.handle.chunk_base;
  out->request.generation = request.handle.generation;
  out->request.watch = (request.flags & wire::kRequestFlagWatch) != 0;
  out->request.follower = request.follower;
  out->request.announce = (request.flags & wire::kRequestFlagAnnounce) != 0;
  out->kept = c.kept;
  return ReadOutcome::kReady;
}

// The handler's reply, checked; false when a refusal was sent instead.
bool Prepare(PendingRequest& p, const ServeContext& context, ServeReply* reply) {
  auto refuse = [&](RefuseReason reason, const std::string& why) {
    SendRefusal(p.fd.get(), context, p.key, p.peer, p.nonce, p.request.address, reason, why,
                context.timeout.ms());
    return false;
  };
  try {
    *reply = (*context.handler)(p.request);
  } catch (const std::exception& e) {
    return refuse(RefuseReason::kInternal, fmt::format("the handler threw: {}", e.what()));
  } catch (...) {
    return refuse(RefuseReason::kInternal, "the handler threw a non-standard exception");
  }
  // From here every fd of the reply is owned by `reply` and closes with it,
  // whether it was sent or not.
  if (reply->refuse != RefuseReason::kNone)
    return refuse(reply->refuse, reply->detail.empty() ? "the handler refused" : reply->detail);
  std::string why;
  if (RefuseReason bad = CheckGrants(&reply->chunks, &why); bad != RefuseReason::kNone)
    return refuse(bad, why);
  return true;
}

// Runs `step`, which says whether the connection went where it should; an
// exception (out of memory, say) never leaves this file: one error line, and
// false, as for a step that failed.
template <typename Step>
bool Guarded(const ServeContext& context, Step step) noexcept {
  try {
    return step();
  } catch (const std::exception& e) {
    VMMIPC_LOG_ERROR("listener {}: dropped a connection: {}", context.name, e.what());
  } catch (...) {
    VMMIPC_LOG_ERROR("listener {}: dropped a connection: unknown exception", context.name);
  }
  return false;
}

// A request that is not answered after all: its watcher's reservation
// cancelled, its connection closed.
void GiveUp(PendingRequest& request, const ServeContext& context) {
  if (request.watcher) context.watchers->Cancel(request.watcher);
  Close(std::move(request.fd), context);
}

}  // namespace

bool StartConnection(ScopedFd fd, const ServeContext& context, Connection* out) noexcept {
  PeerCredentials peer;
  if (IoResult io = GetPeerCredentials(fd.get(), &peer); !io.ok()) {
    if (MayLog(context.name))
      VMMIPC_LOG_WARN("listener {}: dropped a connection: SO_PEERCRED failed: {}", context.name,
                      ErrnoText(io.error));
    Dropped(context);
    Close(std::move(fd), context);
    return false;
  }
  out->fd = std::move(fd);
  out->peer = peer;
  out->deadline = Deadline::AfterMs(peer.uid == context.uid
                                        ? context.timeout.ms()
                                        : std::min(context.timeout.ms(), kOtherUserGraceMs));
  return true;
}

ReadOutcome ReadRequest(Connection& connection, const ServeContext& context,
                        PendingRequest* out) noexcept {
  ReadOutcome outcome = ReadOutcome::kDone;
  if (Guarded(context, [&] {
        outcome = Read(connection, context, out);
        return true;
      }))
    return outcome;
  Close(std::move(connection.fd), context);
  return ReadOutcome::kDone;
}

void DropSilent(Connection connection, const ServeContext& context) noexcept {
  const bool same_user = connection.peer.uid == context.uid;
  if (MayLog(context.name))
    VMMIPC_LOG_WARN(
        "listener {}: dropped peer {} uid {}: no request (timed out after {} "
        "ms{})",
        context.name, PeerPidText(connection.peer.pid), connection.peer.uid,
        same_user ? context.timeout.ms() : std::min(context.timeout.ms(), kOtherUserGraceMs),
        same_user ? "" : ", another user's grace");
  Dropped(context);
  Close(std::move(connection.fd), context);
}

void DropOverCap(Connection connection, const ServeContext& context,
                 const std::string& why) noexcept {
  if (MayLog(context.name))
    VMMIPC_LOG_WARN("listener {}: closed peer {} uid {} at once: {}", context.name,
                    PeerPidText(connection.peer.pid), connection.peer.uid, why);
  Dropped(context);
  Close(std::move(connection.fd), context);
}

bool PrepareReply(PendingRequest& request, const ServeContext& context,
                  ServeReply* reply) noexcept {
  const bool prepared = Guarded(context, [&] {
    // The watcher first, so that a pause after the grant is told (watchers.h).
    if (request.request.watch && context.watchers != nullptr) {
      std::string refused;
      request.watcher =
          context.watchers->Reserve(request.request.follower, request.peer.pid, request.key,
                                    request.nonce, request.request.announce, &refused);
      if (!request.watcher && MayLog(context.name))
        VMMIPC_LOG_WARN(
            "listener {}: importer {} asked to follow this process, but {}: it is answered "
            "without a watch connection, and does not follow pauses of what it is granted",
            context.name, PeerPidText(request.peer.pid), refused);
    }
    return Prepare(request, context, reply);
  });
  if (!prepared) GiveUp(request, context);
  return prepared;
}

void RefuseRequest(PendingRequest request, RefuseReason reason, const std::string& why,
                   const ServeContext& context) noexcept {
  Guarded(context, [&] {
    SendRefusal(request.fd.get(), context, request.key, request.peer, request.nonce,
                request.request.address, reason, why,
                std::min(context.timeout.ms(), kRefusalSendMs));
    return true;
  });
  GiveUp(request, context);
}

void SendReply(PendingRequest request, const ServeReply& reply,
               const ServeContext& context) noexcept {
  Close(SendReplyKeeping(std::move(request), reply, context), context);
}

ScopedFd SendReplyKeeping(PendingRequest request, const ServeReply& reply,
                          const ServeContext& context) noexcept {
  ScopedFd kept;
  const bool sent = Guarded(context, [&] {
    if (!SendGrants(request, context, reply)) return false;
    if (request.watcher) {
      context.watchers->Activate(request.watcher, std::move(request.fd));
      VMMIPC_LOG_DEBUG("listener {}: importer {} watches this process", context.name,
                       PeerPidText(request.peer.pid));
    } else if (request.request.watch) {
      // A watch request's importer keeps the connection for events (even
      // when no watcher was free for it here): it sends no request there.
      Close(std::move(request.fd), context);
    } else {
      kept = std::move(request.fd);
    }
    return true;
  });
  if (!sent) GiveUp(request, context);
  return kept;
}

void CloseKept(Connection connection, const ServeContext& context) noexcept {
  VMMIPC_LOG_TRACE("listener {}: closed the kept connection of peer {}", context.name,
                   PeerPidText(connection.peer.pid));
  Close(std::move(connection.fd), context);
}

bool ReplyFitsOneMessage(const ServeReply& reply) noexcept {
  return reply.chunks.size() <= wire::kMaxChunksPerBatch;
}

}  // namespace vmmipc::transport
