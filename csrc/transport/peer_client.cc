// The importer's side of one exchange: connect, check who listens, send the
// MAC'd request, then collect and verify every reply batch and its fds. Any
// failure closes every fd received so far (they live in ScopedFd throughout).
#include "transport/peer_client.h"

#include <unistd.h>

#include <algorithm>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/random.h"
#include "common/syscall.h"
#include "transport/fd_channel.h"
#include "transport/fd_reaper.h"
#include "transport/peer_fds.h"
#include "transport/socket_address.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

FetchResult Fail(FetchStatus status, std::string detail) {
  FetchResult result;
  result.status = status;
  result.detail = std::move(detail);
  return result;
}

// Maps a socket-level failure while talking to the exporter.
FetchResult IoFailure(const IoResult& io, const std::string& what, const SocketAddress& address,
                      int timeout_ms) {
  switch (io.status) {
    case IoStatus::kTimeout:
      return Fail(FetchStatus::kTimeout, fmt::format("{} on {}: no answer within {} ms", what,
                                                     address.display, timeout_ms));
    case IoStatus::kNoResources:
      return Fail(FetchStatus::kNoResources,
                  fmt::format("{} on {}: {}", what, address.display, ErrnoText(io.error)));
    case IoStatus::kPeerClosed:
      return Fail(
          FetchStatus::kProtocolError,
          fmt::format("{} on {}: the exporter closed the connection", what, address.display));
    default:
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} on {}: {}", what, address.display, ErrnoText(io.error)));
  }
}

}  // namespace

const char* FetchStatusName(FetchStatus status) {
  switch (status) {
    case FetchStatus::kOk:
      return "ok";
#define VMMIPC_FETCH_NAME(id, name) \
  case FetchStatus::id:             \
    return name;
      VMMIPC_FETCH_FAILURES(VMMIPC_FETCH_NAME)
#undef VMMIPC_FETCH_NAME
  }
  return "unknown";
}

FetchResult FetchChunks(const FetchRequest& request, const ClientOptions& options) try {
  const auto start = SteadyClock::now();
  const int timeout_ms = std::max(options.timeout_ms, 1);
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  const uint32_t my_uid = ::geteuid();

  SocketAddress address;
  std::string error;
  if (!MakeSocketAddress(my_uid, request.exporter_pid, options.socket_dir, &address, &error)) {
    return Fail(FetchStatus::kNoExporter, error);
  }

  ScopedFd sock;
  // Whatever the exchange's end, anything still queued (an unverified
  // answer's fds) is closed off this thread.
  struct CloseOnExit {
    ScopedFd& fd;
    ~CloseOnExit() { CloseConnection(std::move(fd)); }
  } close_on_exit{sock};
  if (IoResult io = ConnectSeqpacket(address, deadline, &sock); !io.ok()) {
    if (io.status == IoStatus::kError &&
        (io.error == ECONNREFUSED || io.error == ENOENT || io.error == ENOTDIR)) {
      return Fail(FetchStatus::kNoExporter,
                  fmt::format("nobody listens on {} (exporter pid {} exited?): {}", address.display,
                              request.exporter_pid, ErrnoText(io.error)));
    }
    return IoFailure(io, "connecting", address, timeout_ms);
  }
  const auto connected = SteadyClock::now();

  // Check who holds the name before saying anything to it: another user's
  // process squatting it gets not even our request.
  PeerCredentials server;
  if (IoResult io = GetPeerCredentials(sock.get(), &server); !io.ok()) {
    return IoFailure(io, "reading the exporter's credentials", address, timeout_ms);
  }
  if (server.uid != my_uid) {
    return Fail(FetchStatus::kUnauthentic,
                fmt::format("{} is held by pid {} of uid {}, not by our uid {}", address.display,
                            server.pid, server.uid, my_uid));
  }

  wire::Request wire_request;
  wire_request.flags = options.watch ? wire::kRequestFlagWatch : 0;
  wire_request.follower = options.follower;
  wire_request.exporter_pid = request.exporter_pid;
  wire_request.address = request.address;
  wire_request.chunk_base = request.chunk_base;
  wire_request.chunk_size = request.chunk_size;
  wire_request.region_base = request.region_base;
  wire_request.generation = request.generation;
  wire_request.rank_slot = request.rank_slot;
  // 128 bits that make this exchange's reply MACs its own: random from the
  // kernel, else (a seccomp policy refusing getrandom, no /dev/urandom) only
  // unique, which is what a nonce needs (docs/security.md).
  FillUnique(wire_request.nonce.data(), wire_request.nonce.size());
  const SipKey key = wire::DeriveKey(request.capability, request.exporter_pid);
  const auto request_bytes = wire::EncodeRequest(wire_request, key);
  if (IoResult io = SendMessage(sock.get(), request_bytes, {}, deadline); !io.ok()) {
    return IoFailure(io, "sending the request", address, timeout_ms);
  }

  std::vector<ChunkGrant> chunks;
  // A reply that fails after some batches: their fds go to the reaper too.
  struct ReapGranted {
    std::vector<ChunkGrant>& chunks;
    ~ReapGranted() {
      for (ChunkGrant& chunk : chunks) CloseInBackground(std::move(chunk.fd));
    }
  } reap_granted{chunks};
  std::vector<uint8_t> buffer(wire::kMaxReplySize);
  uint32_t total = 0;
  uint32_t batch_count = 1;
  for (uint32_t batch = 0; batch < batch_count; ++batch) {
    const std::string what = fmt::format("receiving reply batch {}", batch);
    // Look before taking: an answer that does not verify never gets its fds
    // installed here (a squatter's fd may be a socket whose last close
    // blocks for its linger time); the connection then goes to the reaper.
    PeekedMessage peeked;
    if (IoResult io = PeekMessage(sock.get(), buffer, &peeked, deadline); !io.ok()) {
      return IoFailure(io, what, address, timeout_ms);
    }
    if (peeked.truncated) {
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} from {}: message longer than {} bytes", what, address.display,
                              buffer.size()));
    }
    wire::ReplyHeader header;
    std::vector<wire::ReplyEntry> entries;
    const std::span<const uint8_t> bytes(buffer.data(), peeked.length);
    const wire::WireError parsed =
        wire::ParseReply(bytes, wire_request.nonce, key, &header, &entries);
    ReceivedMessage message;
    // Whatever this batch's end, the fds it did not hand on go to the reaper:
    // none is closed on this (the application's) thread.
    struct ReapUnused {
      std::vector<ScopedFd>& fds;
      ~ReapUnused() { HandToReaper(&fds); }
    } reap_unused{message.fds};
    if (parsed == wire::WireError::kOk) {
      // Verified: now take the message for real, with its fds.
      std::vector<uint8_t> again(buffer.size());
      if (IoResult io = ReceiveMessage(sock.get(), again, &message, deadline); !io.ok()) {
        return IoFailure(io, what, address, timeout_ms);
      }
      // Before anything else touches them: a socket, a FIFO or a terminal is
      // no device memory, and would be a close that may wait.
      if (std::string why; !AllMemoryFdKinds(message.fds, &why)) {
        return Fail(FetchStatus::kProtocolError,
                    fmt::format("{} from {}: {}", what, address.display, why));
      }
      if (message.length != peeked.length ||
          !std::equal(bytes.begin(), bytes.end(), again.begin())) {
        return Fail(FetchStatus::kProtocolError,
                    fmt::format("{} from {}: the message changed between peek and receive", what,
                                address.display));
      }
    } else {
      message.length = peeked.length;  // left queued, fds and all: closed by the reaper
    }
    if (parsed == wire::WireError::kBadMac) {
      // A process that did not make this handle cannot MAC anything we can
      // verify, so a real exporter that says "bad token" (a stale handle whose
      // pid now belongs to another vmmipc process, or an edited handle) looks
      // just like a forger. Such a
      // bare refusal carries nothing we would use, so it is reported as the
      // refusal it claims to be, marked unverified; anything else is forged.
      if (header.status == static_cast<uint16_t>(RefuseReason::kBadToken) && batch == 0 &&
          header.entry_count == 0 && message.length == wire::kReplyHeaderSize &&
          !peeked.carries_fds) {
        FetchResult result = Fail(
            FetchStatus::kRefused,
            fmt::format("{} refused the handle's token (unverified answer: pid {} was reused, or "
                        "the handle was edited or forged)",
                        address.display, request.exporter_pid));
        result.refuse = RefuseReason::kBadToken;
        return result;
      }
      return Fail(FetchStatus::kUnauthentic,
                  fmt::format("{} answered batch {} with a MAC that does not verify: not the "
                              "exporter that made this handle",
                              address.display, batch));
    }
    if (parsed != wire::WireError::kOk) {
      return Fail(FetchStatus::kProtocolError, fmt::format("{} from {}: {}", what, address.display,
                                                           wire::WireErrorName(parsed)));
    }
    if (header.status != 0) {
      if (batch != 0 || !message.fds.empty()) {
        return Fail(FetchStatus::kProtocolError,
                    fmt::format("{} from {}: refusal out of place", what, address.display));
      }
      FetchResult result;
      result.status = FetchStatus::kRefused;
      result.refuse = static_cast<RefuseReason>(header.status);
      result.verified = true;
      result.detail = fmt::format("exporter pid {} refused: {}", request.exporter_pid,
                                  RefuseReasonName(result.refuse));
      return result;
    }
    if (header.batch_index != batch || (batch > 0 && header.total_chunks != total)) {
      return Fail(
          FetchStatus::kProtocolError,
          fmt::format("{} from {}: got batch {} of a {}-chunk reply, expected batch {} of {}", what,
                      address.display, header.batch_index, header.total_chunks, batch, total));
    }
    if (message.control_truncated) {
      return Fail(FetchStatus::kNoResources,
                  fmt::format("{} from {}: the kernel dropped {} of the batch's fds (out of fds?)",
                              what, address.display, entries.size() - message.fds.size()));
    }
    if (message.fds.size() != entries.size()) {
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} from {}: {} fds for {} entries", what, address.display,
                              message.fds.size(), entries.size()));
    }
    if (batch == 0) {
      total = header.total_chunks;
      batch_count = header.batch_count;
      chunks.reserve(total);
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      ChunkGrant grant;
      grant.address = entries[i].address;
      grant.size = entries[i].size;
      grant.generation = entries[i].generation;
      grant.fd = std::move(message.fds[i]);
      chunks.push_back(std::move(grant));
    }
  }

  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkGrant& a, const ChunkGrant& b) { return a.address < b.address; });
  for (size_t i = 1; i < chunks.size(); ++i) {
    if (chunks[i - 1].address + chunks[i - 1].size > chunks[i].address) {
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("reply from {}: chunks at {:#x} and {:#x} overlap", address.display,
                              chunks[i - 1].address, chunks[i].address));
    }
  }
  FetchResult result;
  result.status = FetchStatus::kOk;
  result.verified = true;
  result.chunks = std::move(chunks);
  result.connect_us = MicrosBetween(start, connected);
  result.answer_us = MicrosSince(connected);
  if (options.watch) {
    // The answer verified: this connection is the exporter's. Kept for its events.
    result.watch.fd = std::move(sock);
    result.watch.key = key;
    result.watch.nonce = wire_request.nonce;
  }
  return result;
} catch (const std::bad_alloc&) {
  return Fail(FetchStatus::kNoResources, "out of memory");
} catch (const std::exception& e) {
  return Fail(FetchStatus::kProtocolError, fmt::format("unexpected error: {}", e.what()));
} catch (...) {
  return Fail(FetchStatus::kProtocolError, "unexpected error");
}

}  // namespace vmmipc::transport
