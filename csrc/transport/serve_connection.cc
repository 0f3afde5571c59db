// One connection, served in order: credentials, request, checks, handler,
// reply batches. Every failure ends in a refusal (when the peer can be told)
// or a closed connection, with one log line; no exception leaves this file.
#include "transport/serve_connection.h"

#include <algorithm>
#include <exception>

#include "common/log.h"
#include "common/status.h"
#include "transport/fd_channel.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

static_assert(wire::kMaxChunksPerBatch <= kMaxFdsPerMessage, "a batch's fds must fit one message");

// Generous for a v1 request (64 bytes); a longer one arrives truncated and
// is refused as kBadRequest, its preamble still readable for the reply.
constexpr size_t kRequestBufferSize = 512;

// How long a peer of another uid may take to show its request. Such a peer is
// never one of our importers (socket names carry the uid), so it gets a short
// grace, only enough for its kWrongUser answer, rather than the full timeout:
// otherwise any local user could hold the one listener thread timeout_ms at a
// time by connecting and staying silent (a full backlog of 64 such peers
// then costs at most 64 x 50 ms).
constexpr int kOtherUserGraceMs = 50;

struct Exchange {
  const ServeContext& context;
  int fd;
  PeerCredentials peer;
  wire::Nonce nonce{};
  uint64_t address = 0;  // as the request claims it (unverified until the MAC checks)
};

void SendRefusal(const Exchange& x, RefuseReason reason, const std::string& why) {
  if (x.context.events.refused != nullptr) x.context.events.refused(reason);
  VMMIPC_LOG_WARN("listener {}: refused peer pid {} uid {} for address {:#x}: {} ({})",
                  x.context.name, x.peer.pid, x.peer.uid, x.address, RefuseReasonName(reason), why);
  wire::ReplyHeader header;
  header.status = static_cast<uint16_t>(reason);
  header.total_chunks = 0;
  header.batch_index = 0;
  header.batch_count = 1;
  const std::vector<uint8_t> bytes = wire::EncodeReply(x.nonce, x.context.key, header, {});
  const Deadline deadline = Deadline::AfterMs(x.context.timeout_ms);
  if (IoResult io = SendMessage(x.fd, bytes, {}, deadline, x.context.stop_fd); !io.ok()) {
    VMMIPC_LOG_DEBUG("listener {}: refusal to pid {} not delivered: {}", x.context.name, x.peer.pid,
                     IoStatusName(io.status));
  }
}

// Checks what the handler granted; kNone when it can be sent as is.
RefuseReason CheckGrants(std::vector<ChunkGrant>* chunks, std::string* why) {
  if (chunks->empty()) {
    *why = "the handler granted no chunks";
    return RefuseReason::kInternal;
  }
  if (chunks->size() > wire::kMaxTotalChunks) {
    *why = fmt::format("{} chunks, the protocol allows {}", chunks->size(), wire::kMaxTotalChunks);
    return RefuseReason::kTooManyChunks;
  }
  std::sort(chunks->begin(), chunks->end(),
            [](const ChunkGrant& a, const ChunkGrant& b) { return a.address < b.address; });
  for (size_t i = 0; i < chunks->size(); ++i) {
    const ChunkGrant& c = (*chunks)[i];
    if (!c.fd.valid() || c.size == 0 || c.address + c.size < c.address) {
      *why = fmt::format("the handler granted an invalid chunk at {:#x} (size {}, fd {})",
                         c.address, c.size, c.fd.get());
      return RefuseReason::kInternal;
    }
    if (i > 0 && (*chunks)[i - 1].address + (*chunks)[i - 1].size > c.address) {
      *why = fmt::format("the handler granted overlapping chunks at {:#x} and {:#x}",
                         (*chunks)[i - 1].address, c.address);
      return RefuseReason::kInternal;
    }
  }
  return RefuseReason::kNone;
}

void SendGrants(const Exchange& x, const std::vector<ChunkGrant>& chunks) {
  const uint32_t total = static_cast<uint32_t>(chunks.size());
  const uint32_t batches = wire::BatchCount(total);
  // A fresh deadline: the handler's time (exporting chunks) is not the peer's fault.
  const Deadline deadline = Deadline::AfterMs(x.context.timeout_ms);
  std::vector<wire::ReplyEntry> entries;
  std::vector<int> fds;
  for (uint32_t batch = 0; batch < batches; ++batch) {
    const size_t begin = size_t{batch} * wire::kMaxChunksPerBatch;
    const size_t end = std::min(chunks.size(), begin + wire::kMaxChunksPerBatch);
    entries.clear();
    fds.clear();
    for (size_t i = begin; i < end; ++i) {
      entries.push_back({chunks[i].address, chunks[i].size, chunks[i].generation});
      fds.push_back(chunks[i].fd.get());
    }
    wire::ReplyHeader header;
    header.status = 0;
    header.total_chunks = total;
    header.batch_index = batch;
    header.batch_count = batches;
    const std::vector<uint8_t> bytes = wire::EncodeReply(x.nonce, x.context.key, header, entries);
    if (IoResult io = SendMessage(x.fd, bytes, fds, deadline, x.context.stop_fd); !io.ok()) {
      VMMIPC_LOG_WARN("listener {}: sending batch {} of {} to peer pid {} failed: {} ({})",
                      x.context.name, batch, batches, x.peer.pid, IoStatusName(io.status),
                      io.error != 0 ? ErrnoText(io.error) : "no errno");
      return;
    }
  }
  if (x.context.events.granted != nullptr) x.context.events.granted(total);
  VMMIPC_LOG_DEBUG("listener {}: granted {} chunks in {} batches to peer pid {} for address {:#x}",
                   x.context.name, total, batches, x.peer.pid, x.address);
}

void Serve(ScopedFd connection, const ServeContext& context) {
  Exchange x{context, connection.get(), {}};
  if (IoResult io = GetPeerCredentials(x.fd, &x.peer); !io.ok()) {
    VMMIPC_LOG_WARN("listener {}: dropped a connection: SO_PEERCRED failed: {}", context.name,
                    ErrnoText(io.error));
    if (context.events.dropped != nullptr) context.events.dropped();
    return;
  }

  std::vector<uint8_t> buffer(kRequestBufferSize);
  ReceivedMessage message;
  const bool same_user = x.peer.uid == context.uid;
  const int wait_ms =
      same_user ? context.timeout_ms : std::min(context.timeout_ms, kOtherUserGraceMs);
  const Deadline deadline = Deadline::AfterMs(wait_ms);
  if (IoResult io = ReceiveMessage(x.fd, buffer, &message, deadline, context.stop_fd); !io.ok()) {
    if (io.status == IoStatus::kStopped) return;
    VMMIPC_LOG_WARN("listener {}: dropped peer pid {} uid {}: no request ({}{}{}{})", context.name,
                    x.peer.pid, x.peer.uid, IoStatusName(io.status),
                    io.status == IoStatus::kTimeout ? fmt::format(" after {} ms", wait_ms)
                                                    : std::string(),
                    same_user ? "" : ", another user's grace",
                    io.error != 0 ? fmt::format(": {}", ErrnoText(io.error)) : std::string());
    if (context.events.dropped != nullptr) context.events.dropped();
    return;
  }
  const std::span<const uint8_t> bytes(buffer.data(), message.length);

  wire::RequestPreamble preamble;
  if (wire::WireError e = wire::ParseRequestPreamble(bytes, &preamble); e != wire::WireError::kOk) {
    // Without a preamble there is no nonce to MAC a refusal with: just hang up.
    VMMIPC_LOG_WARN("listener {}: dropped peer pid {} uid {}: not a vmmipc request ({})",
                    context.name, x.peer.pid, x.peer.uid, wire::WireErrorName(e));
    if (context.events.dropped != nullptr) context.events.dropped();
    return;
  }
  x.nonce = preamble.nonce;
  if (message.length >= wire::kRequestSize) {
    // For the log line only; it is not trusted for anything.
    for (int i = 7; i >= 0; --i) x.address = (x.address << 8) | bytes[32 + i];
  }

  // The uid check comes before anything else is looked at: another user gets
  // nothing but this refusal, whatever it sent.
  if (x.peer.uid != context.uid) {
    SendRefusal(x, RefuseReason::kWrongUser,
                fmt::format("peer uid {} is not this process's uid {}", x.peer.uid, context.uid));
    return;
  }
  if (!message.fds.empty()) {
    SendRefusal(x, RefuseReason::kBadRequest,
                fmt::format("the request carried {} fds", message.fds.size()));
    return;  // the fds close with `message`
  }
  if (message.truncated) {
    SendRefusal(x, RefuseReason::kBadRequest,
                fmt::format("request longer than {} bytes", kRequestBufferSize));
    return;
  }
  wire::Request request;
  const wire::WireError parsed = wire::ParseRequest(bytes, context.key, &request);
  if (parsed == wire::WireError::kBadMac) {
    SendRefusal(x, RefuseReason::kBadToken,
                fmt::format("request MAC does not verify for pid {} (stale handle after pid reuse, "
                            "or a forged request)",
                            preamble.exporter_pid));
    return;
  }
  if (parsed != wire::WireError::kOk) {
    SendRefusal(x, RefuseReason::kBadRequest,
                fmt::format("request version {}, {} bytes: {}", preamble.version, message.length,
                            wire::WireErrorName(parsed)));
    return;
  }

  ServeRequest serve_request;
  serve_request.peer_pid = x.peer.pid;
  serve_request.peer_uid = x.peer.uid;
  serve_request.address = request.address;
  serve_request.chunk_base = request.chunk_base;
  serve_request.generation = request.generation;
  ServeReply reply;
  try {
    reply = (*context.handler)(serve_request);
  } catch (const std::exception& e) {
    SendRefusal(x, RefuseReason::kInternal, fmt::format("the handler threw: {}", e.what()));
    return;
  } catch (...) {
    SendRefusal(x, RefuseReason::kInternal, "the handler threw a non-standard exception");
    return;
  }
  // From here every fd of the reply is owned by `reply` and closes with it,
  // whether it was sent or not.
  if (reply.refuse != RefuseReason::kNone) {
    SendRefusal(x, reply.refuse, reply.detail.empty() ? "the handler refused" : reply.detail);
    return;
  }
  std::string why;
  if (RefuseReason bad = CheckGrants(&reply.chunks, &why); bad != RefuseReason::kNone) {
    SendRefusal(x, bad, why);
    return;
  }
  SendGrants(x, reply.chunks);
}

}  // namespace

void ServeConnection(ScopedFd connection, const ServeContext& context) noexcept {
  try {
    Serve(std::move(connection), context);
  } catch (const std::exception& e) {
    VMMIPC_LOG_ERROR("listener {}: dropped a connection: {}", context.name, e.what());
  } catch (...) {
    VMMIPC_LOG_ERROR("listener {}: dropped a connection: unknown exception", context.name);
  }
}

}  // namespace vmmipc::transport
