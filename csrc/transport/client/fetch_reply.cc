// The reply of one fetch, batch by batch: each looked at before it is taken
// (its MAC checked on a peeked copy, so no fd of an answer that does not
// verify is ever installed), then taken with its fds, checked against the
// reply so far, and its chunks added to the fetch's.
#include <algorithm>
#include <utility>

#include "common/log.h"
#include "transport/client/fetch_state.h"
#include "transport/client/peer_fds.h"

namespace vmmipc::transport::fetch_internal {
namespace {

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

FetchResult BatchFailure(FetchStatus status, const Batch& batch, const Fetch& fetch,
                         const std::string& why) {
  return Fail(status, fmt::format("{} from {}: {}", batch.what, fetch.address.display, why));
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
    const wire::ReplyEntry& entry = batch.entries[i];
    ChunkGrant grant;
    grant.address = entry.address;
    grant.size = entry.size;
    grant.generation = entry.generation;
    grant.fd = std::move(batch.message.fds[i]);
    fetch.chunks.push_back(std::move(grant));
  }
  return std::nullopt;
}

}  // namespace

Ended ReceiveReply(Fetch& fetch) {
  std::vector<uint8_t> buffer(wire::kMaxReplySize);
  for (uint32_t batch = 0; batch < fetch.batch_count; ++batch) {
    if (Ended ended = ReceiveBatch(fetch, buffer, batch)) return ended;
  }
  if (fetch.chunks.empty())
    return Fail(FetchStatus::kProtocolError,
                fmt::format("reply from {}: no chunk of the handle's run", fetch.address.display));
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

}  // namespace vmmipc::transport::fetch_internal
