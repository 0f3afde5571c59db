// The importer's side of one exchange, as named steps over one Fetch: connect
// (and check who listens), send the MAC'd request, receive and verify every
// reply batch and its fds, check the chunks, hand them over. Every wait of
// every step is bounded by the fetch's one deadline, never by one of its
// own. Any failure closes every fd received so far (they live in ScopedFd
// throughout, and go to the reaper: none is closed on the caller's thread).
#include "transport/client/fetch_client.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/random.h"
#include "common/syscall.h"
#include "transport/client/peer_fds.h"
#include "transport/client/warm_connections.h"
#include "transport/reaper/fd_reaper.h"
#include "transport/socket_address.h"
#include "transport/socket_io.h"
#include "transport/socket_uid.h"
#include "transport/wire.h"

namespace vmmipc::transport {
namespace {

// One fetch's state, from the first step to the hand-over.
struct Fetch {
  Fetch(const FetchRequest& r, const ClientOptions& o)
      : request(r),
        options(o),
        timeout_ms(o.timeout.ms()),
        deadline(Deadline::AfterMs(timeout_ms)) {}
  // Whatever the fetch's end: the chunks of the batches received so far go
  // to the reaper, and so does the connection with anything still queued
  // on it (an unverified answer's fds), unless the hand-over took them.
  ~Fetch() {
    for (ChunkGrant& chunk : chunks) CloseInBackground(std::move(chunk.fd));
    CloseConnection(std::move(sock));
  }
  Fetch(const Fetch&) = delete;
  Fetch& operator=(const Fetch&) = delete;

  const FetchRequest& request;
  const ClientOptions& options;
  const SteadyClock::time_point start = SteadyClock::now();
  const int timeout_ms;
  // The one bound of the whole exchange: connect, send and every receive
  // wait against it, so that a slow peer cannot stretch it step by step.
  const Deadline deadline;
  const uint32_t uid = ::geteuid();
  SocketAddress address;
  ScopedFd sock;
  // The request goes on a kept connection (warm_connections.h), and whether
  // that connection turned out dead before any answer came (its exporter
  // closed it just before our request): then the fetch connects afresh once.
  bool reused = false;
  bool warm_lost = false;
  SteadyClock::time_point connected;
  SipKey key;                // the handle's: MACs the request and every answer
  wire::Nonce nonce{};       // this exchange's: every answer must carry it
  uint32_t total = 0;        // chunks in the reply, as its batch 0 says
  uint32_t batch_count = 1;  // batches in the reply, as its batch 0 says
  std::vector<ChunkGrant> chunks;
};

// One reply batch, looked at (peeked) and then taken with its fds.
struct Batch {
  explicit Batch(uint32_t i) : index(i), what(fmt::format("receiving reply batch {}", i)) {}
  // Whatever this batch's end, the fds it did not hand on go to the reaper:
  // none is closed on this (the application's) thread.
  ~Batch() { HandToReaper(&message.fds); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  const uint32_t index;
  const std::string what;  // for the log line of a failure
  PeekedMessage peeked;
  std::span<const uint8_t> bytes;  // the peeked message, in the fetch's buffer
  wire::WireError parsed = wire::WireError::kOk;
  wire::ReplyHeader header;
  std::vector<wire::ReplyEntry> entries;
  ReceivedMessage message;
};

// A step's verdict: empty when the fetch goes on, else how it ends (a
// failure, or the exporter's refusal).
using Ended = std::optional<FetchResult>;

FetchResult Fail(FetchStatus status, std::string detail) {
  FetchResult result;
  result.status = status;
  result.detail = std::move(detail);
  return result;
}

// Maps a socket-level failure while talking to the exporter.
FetchResult IoFailure(const IoResult& io, const std::string& what, const Fetch& fetch) {
  const std::string& name = fetch.address.display;
  switch (io.status) {
    case IoStatus::kTimeout:
      return Fail(FetchStatus::kTimeout,
                  fmt::format("{} on {}: no answer within {} ms", what, name, fetch.timeout_ms));
    case IoStatus::kNoResources:
      return Fail(FetchStatus::kNoResources,
                  fmt::format("{} on {}: {}", what, name, ErrnoText(io.error)));
    case IoStatus::kPeerClosed:
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} on {}: the exporter closed the connection", what, name));
    default:
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("{} on {}: {}", what, name, ErrnoText(io.error)));
  }
}

FetchResult BatchFailure(FetchStatus status, const Batch& batch, const Fetch& fetch,
                         const std::string& why) {
  return Fail(status, fmt::format("{} from {}: {}", batch.what, fetch.address.display, why));
}

// Why nobody may listen under the exporter's name, in the order they happen:
// it exited; it runs in another network namespace (a container without
// --network=host: abstract names do not cross, a shared VMMIPC_SOCKET_DIR
// does) or uses another socket directory; it runs as another user (of the
// host, once user namespaces are mapped: socket_uid.h).
std::string NoListenerReasons(const Fetch& fetch) {
  const uint32_t name_uid = SocketNameUid(fetch.uid);
  std::string user = fmt::format("or runs as another uid than {}", name_uid);
  if (name_uid != fetch.uid) {
    user += fmt::format(" (this process is uid {} in a user namespace, uid {} outside it)",
                        fetch.uid, name_uid);
  }
  const std::string where =
      fetch.address.abstract
          ? "or runs in another network namespace, which abstract socket names do not reach "
            "(set VMMIPC_SOCKET_DIR to a directory both processes see)"
          : "or uses another VMMIPC_SOCKET_DIR";
  return fmt::format("the exporter (pid {} as its own pid namespace numbers it) has exited, {}, {}",
                     fetch.request.handle.exporter_pid, where, user);
}

// The name of the handle's exporter: its instance (a version 2 handle: its
// pid); first of all, whether the reaper can take what this fetch may be sent.
Ended Address(Fetch& fetch) {
  // The reaper's threads are stuck and what it is handed now stays open in
  // this table (fd_reaper.h): a peer's answer could add more. Refused at
  // once, until they come back; a warm connection's answer too.
  if (!ReaperTakesMore()) {
    return Fail(FetchStatus::kNoResources,
                "the fd reaper takes no more (its threads are stuck in closes that do not "
                "return, a peer's FUSE file or terminal); refusing to take a peer's fds until "
                "they come back");
  }
  std::string error;
  const FetchRequest& request = fetch.request;
  const SocketOwner owner = request.exporter_instance != 0
                                ? SocketOwner::Instance(request.exporter_instance)
                                : SocketOwner::Pid(request.handle.exporter_pid);
  if (!MakeSocketAddress(fetch.uid, owner, fetch.options.socket_dir, &fetch.address, &error)) {
    return Fail(FetchStatus::kNoExporter, error);
  }
  return std::nullopt;
}

// A kept connection to that name, if there is one fit for a request: its
// exporter's credentials were checked when it was made, and SO_PEERCRED
// does not change for the life of a connection.
bool TakeWarm(Fetch& fetch) {
  if (fetch.options.warm_connections == 0) return false;
  fetch.sock = TakeWarmConnection(fetch.address.display);
  if (!fetch.sock.valid()) return false;
  fetch.reused = true;
  fetch.connected = SteadyClock::now();
  return true;
}

// Connects to that name, then checks who holds it before saying anything to
// it: another user's process squatting the name gets not even our request.
Ended Connect(Fetch& fetch) {
  if (IoResult io = ConnectSeqpacket(fetch.address, fetch.deadline, &fetch.sock); !io.ok()) {
    if (io.status == IoStatus::kError &&
        (io.error == ECONNREFUSED || io.error == ENOENT || io.error == ENOTDIR)) {
      return Fail(FetchStatus::kNoExporter,
                  fmt::format("nobody listens on {}: {}; {}", fetch.address.display,
                              ErrnoText(io.error), NoListenerReasons(fetch)));
    }
    return IoFailure(io, "connecting", fetch);
  }
  fetch.connected = SteadyClock::now();
  PeerCredentials server;
  if (IoResult io = GetPeerCredentials(fetch.sock.get(), &server); !io.ok()) {
    return IoFailure(io, "reading the exporter's credentials", fetch);
  }
  if (server.uid != fetch.uid) {
    return Fail(FetchStatus::kUnauthentic,
                fmt::format("{} is held by {} of uid {}, not by our uid {}", fetch.address.display,
                            PeerPidText(server.pid), server.uid, fetch.uid));
  }
  // The overflow uid is every unmapped user's (socket_uid.h): never ours.
  if (IsOverflowUid(server.uid)) {
    return Fail(FetchStatus::kUnauthentic,
                fmt::format("{} is held by {} of the overflow uid {}, which every user without "
                            "a mapping in this process's user namespace reads as: not taken for "
                            "our own",
                            fetch.address.display, PeerPidText(server.pid), server.uid));
  }
  return std::nullopt;
}

// Sends every field of the handle, MAC'd under its capability, with a fresh nonce.
Ended SendRequest(Fetch& fetch) {
  const FetchRequest& request = fetch.request;
  wire::Request wire_request;
  wire_request.flags = fetch.options.watch ? wire::kRequestFlagWatch : 0;
  wire_request.follower = fetch.options.follower;
  wire_request.handle = request.handle;
  // 128 bits that make this exchange's reply MACs its own: random from the
  // kernel, else (a seccomp policy refusing getrandom, no /dev/urandom) only
  // unique, which is what a nonce needs (docs/security.md).
  FillUnique(wire_request.nonce.data(), wire_request.nonce.size());
  fetch.nonce = wire_request.nonce;
  fetch.key = wire::DeriveKey(request.capability, request.handle.exporter_pid);
  const auto request_bytes = wire::EncodeRequest(wire_request, fetch.key);
  if (IoResult io = SendMessage(fetch.sock.get(), request_bytes, {}, fetch.deadline); !io.ok()) {
    fetch.warm_lost = fetch.reused && io.status == IoStatus::kPeerClosed;
    return IoFailure(io, "sending the request", fetch);
  }
  return std::nullopt;
}

// Looks at the next batch before taking it, and checks its MAC: an answer
// that does not verify never gets its fds installed here (a squatter's fd
// may be a socket whose last close blocks for its linger time).
Ended PeekBatch(Fetch& fetch, std::vector<uint8_t>& buffer, Batch& batch) {
  if (IoResult io = PeekMessage(fetch.sock.get(), buffer, &batch.peeked, fetch.deadline);
      !io.ok()) {
    fetch.warm_lost = fetch.reused && batch.index == 0 && io.status == IoStatus::kPeerClosed;
    return IoFailure(io, batch.what, fetch);
  }
  if (batch.peeked.truncated) {
    return BatchFailure(FetchStatus::kProtocolError, batch, fetch,
                        fmt::format("message longer than {} bytes", buffer.size()));
  }
  batch.bytes = std::span<const uint8_t>(buffer.data(), batch.peeked.length);
  batch.parsed =
      wire::ParseReply(batch.bytes, fetch.nonce, fetch.key, &batch.header, &batch.entries);
  return std::nullopt;
}

// A verified batch: now taken for real, with its fds, which must be what was
// peeked and of kinds that device memory is.
Ended TakeBatch(Fetch& fetch, size_t buffer_size, Batch& batch) {
  std::vector<uint8_t> again(buffer_size);
  if (IoResult io = ReceiveMessage(fetch.sock.get(), again, &batch.message, fetch.deadline);
      !io.ok()) {
    return IoFailure(io, batch.what, fetch);
  }
  // Before anything else touches them: a socket, a FIFO or a terminal is
  // no device memory, and would be a close that may wait.
  if (std::string why; !AllMemoryFdKinds(batch.message.fds, &why)) {
    return BatchFailure(FetchStatus::kProtocolError, batch, fetch, why);
  }
  if (batch.message.length != batch.peeked.length ||
      !std::equal(batch.bytes.begin(), batch.bytes.end(), again.begin())) {
    return BatchFailure(FetchStatus::kProtocolError, batch, fetch,
                        "the message changed between peek and receive");
  }
  return std::nullopt;
}

// A batch whose MAC does not verify, left queued (fds and all) for the reaper.
// A process that did not make this handle cannot MAC anything we can verify,
// so a real exporter that says "bad token" (a stale handle whose pid now
// belongs to another vmmipc process, or an edited handle) looks just like a
// forger. Such a bare refusal carries nothing we would use, so it is reported
// as the refusal it claims to be, marked unverified; anything else is forged.
FetchResult Unverified(const Fetch& fetch, const Batch& batch) {
  if (batch.header.status == static_cast<uint16_t>(RefuseReason::kBadToken) && batch.index == 0 &&
      batch.header.entry_count == 0 && batch.peeked.length == wire::kReplyHeaderSize &&
      !batch.peeked.carries_fds) {
    FetchResult result =
        Fail(FetchStatus::kRefused,
             fmt::format("{} refused the handle's token (unverified answer: the handle was "
                         "edited or forged, or{} names a process that did not make it)",
                         fetch.address.display,
                         fetch.request.exporter_instance != 0 ? "" : ", by a reused pid,"));
    result.refuse = RefuseReason::kBadToken;
    return result;
  }
  return Fail(FetchStatus::kUnauthentic,
              fmt::format("{} answered batch {} with a MAC that does not verify: not the "
                          "exporter that made this handle",
                          fetch.address.display, batch.index));
}

// A verified batch's header against the reply so far: a refusal (batch 0
// only, without fds), else the next batch of the same reply, an fd per entry.
Ended CheckBatch(const Fetch& fetch, const Batch& batch) {
  const wire::ReplyHeader& header = batch.header;
  if (header.status != 0) {
    if (batch.index != 0 || !batch.message.fds.empty()) {
      return BatchFailure(FetchStatus::kProtocolError, batch, fetch, "refusal out of place");
    }
    FetchResult result;
    result.status = FetchStatus::kRefused;
    result.refuse = static_cast<RefuseReason>(header.status);
    result.verified = true;
    result.detail = fmt::format("exporter pid {} refused: {}", fetch.request.handle.exporter_pid,
                                RefuseReasonName(result.refuse));
    return result;
  }
  if (header.batch_index != batch.index ||
      (batch.index > 0 && header.total_chunks != fetch.total)) {
    return BatchFailure(
        FetchStatus::kProtocolError, batch, fetch,
        fmt::format("got batch {} of a {}-chunk reply, expected batch {} of {}", header.batch_index,
                    header.total_chunks, batch.index, fetch.total));
  }
  if (batch.message.control_truncated) {
    return BatchFailure(FetchStatus::kNoResources, batch, fetch,
                        fmt::format("the kernel dropped {} of the batch's fds (out of fds?)",
                                    batch.entries.size() - batch.message.fds.size()));
  }
  if (batch.message.fds.size() != batch.entries.size()) {
    return BatchFailure(
        FetchStatus::kProtocolError, batch, fetch,
        fmt::format("{} fds for {} entries", batch.message.fds.size(), batch.entries.size()));
  }
  return std::nullopt;
}

// Receives one batch, verified, and adds its chunks to the fetch's.
Ended ReceiveBatch(Fetch& fetch, std::vector<uint8_t>& buffer, uint32_t index) {
  Batch batch(index);
  if (Ended ended = PeekBatch(fetch, buffer, batch)) return ended;
  if (batch.parsed == wire::WireError::kOk) {
    if (Ended ended = TakeBatch(fetch, buffer.size(), batch)) return ended;
  }
  if (batch.parsed == wire::WireError::kBadMac) return Unverified(fetch, batch);
  if (batch.parsed != wire::WireError::kOk) {
    return BatchFailure(FetchStatus::kProtocolError, batch, fetch,
                        wire::WireErrorName(batch.parsed));
  }
  if (Ended ended = CheckBatch(fetch, batch)) return ended;
  if (index == 0) {
    fetch.total = batch.header.total_chunks;
    fetch.batch_count = batch.header.batch_count;
    fetch.chunks.reserve(fetch.total);
  }
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    ChunkGrant grant;
    grant.address = batch.entries[i].address;
    grant.size = batch.entries[i].size;
    grant.generation = batch.entries[i].generation;
    grant.fd = std::move(batch.message.fds[i]);
    fetch.chunks.push_back(std::move(grant));
  }
  return std::nullopt;
}

// Every batch of the reply, in order (batch 0 says how many there are), then
// the chunks in address order, none overlapping another.
Ended ReceiveReply(Fetch& fetch) {
  std::vector<uint8_t> buffer(wire::kMaxReplySize);
  for (uint32_t batch = 0; batch < fetch.batch_count; ++batch) {
    if (Ended ended = ReceiveBatch(fetch, buffer, batch)) return ended;
  }
  std::vector<ChunkGrant>& chunks = fetch.chunks;
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkGrant& a, const ChunkGrant& b) { return a.address < b.address; });
  for (size_t i = 1; i < chunks.size(); ++i) {
    if (chunks[i - 1].address + chunks[i - 1].size > chunks[i].address) {
      return Fail(FetchStatus::kProtocolError,
                  fmt::format("reply from {}: chunks at {:#x} and {:#x} overlap",
                              fetch.address.display, chunks[i - 1].address, chunks[i].address));
    }
  }
  return std::nullopt;
}

// The verified chunks to the caller, and with options.watch the connection too.
FetchResult HandOver(Fetch& fetch) {
  FetchResult result;
  result.status = FetchStatus::kOk;
  result.verified = true;
  result.chunks = std::move(fetch.chunks);
  fetch.chunks.clear();  // moved from: nothing left for ~Fetch to reap
  result.connect_us = MicrosBetween(fetch.start, fetch.connected);
  result.answer_us = MicrosSince(fetch.connected);
  result.warm = fetch.reused;
  if (fetch.options.watch) {
    // The answer verified: this connection is the exporter's. Kept for its events.
    result.watch.fd = std::move(fetch.sock);
    result.watch.key = fetch.key;
    result.watch.nonce = fetch.nonce;
  } else {
    // A complete exchange, every batch verified and taken: nothing of this
    // one is left on the connection, which serves the next fetch.
    KeepWarmConnection(fetch.address.display, std::move(fetch.sock),
                       fetch.options.warm_connections);
  }
  return result;
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

// The request and its whole reply, on the fetch's connection.
Ended Exchange(Fetch& fetch) {
  if (Ended ended = SendRequest(fetch)) return ended;
  return ReceiveReply(fetch);
}

FetchResult FetchChunks(const FetchRequest& request, const ClientOptions& options) try {
  Fetch fetch(request, options);
  if (Ended ended = Address(fetch)) return std::move(*ended);
  if (TakeWarm(fetch)) {
    Ended ended = Exchange(fetch);
    if (!ended) return HandOver(fetch);
    // The kept connection was closed by its exporter before it answered
    // (idle, over its budget, or it exited): the request was not served, so
    // it goes once more on a new connection, within the same deadline.
    if (!fetch.warm_lost) return std::move(*ended);
    CloseConnection(std::move(fetch.sock));
    fetch.reused = fetch.warm_lost = false;
  }
  if (Ended ended = Connect(fetch)) return std::move(*ended);
  if (Ended ended = Exchange(fetch)) return std::move(*ended);
  return HandOver(fetch);
} catch (const std::bad_alloc&) {
  return Fail(FetchStatus::kNoResources, "out of memory");
} catch (const std::exception& e) {
  return Fail(FetchStatus::kProtocolError, fmt::format("unexpected error: {}", e.what()));
} catch (...) {
  return Fail(FetchStatus::kProtocolError, "unexpected error");
}

}  // namespace vmmipc::transport
