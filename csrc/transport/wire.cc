// Encoding, decoding and MACs of the protocol records. Every byte of every
// record is written explicitly (no struct memcpy), so layouts do not depend on
// the compiler's padding and no uninitialised byte ever leaves the process.
#include "transport/wire.h"

#include <algorithm>

#include "common/little_endian.h"

namespace vmmipc::transport::wire {
namespace {

// Domain tags: a request MAC can never be replayed as a reply MAC.
constexpr uint8_t kRequestTag[4] = {'r', 'e', 'q', 0};
constexpr uint8_t kReplyTag[4] = {'r', 'e', 'p', 0};
constexpr uint8_t kCapabilityTag[4] = {'c', 'a', 'p', 0};
constexpr uint8_t kEventTag[4] = {'e', 'v', 't', 0};
constexpr uint8_t kAckTag[4] = {'a', 'c', 'k', 0};

void Put16(uint8_t* p, uint16_t v) { StoreLE(p, v); }
void Put32(uint8_t* p, uint32_t v) { StoreLE(p, v); }
void Put64(uint8_t* p, uint64_t v) { StoreLE(p, v); }
uint16_t Get16(const uint8_t* p) { return LoadLE<uint16_t>(p); }
uint32_t Get32(const uint8_t* p) { return LoadLE<uint32_t>(p); }
uint64_t Get64(const uint8_t* p) { return LoadLE<uint64_t>(p); }

// Request MAC: SipHash(key, "req\0" || request bytes [0, 72)).
uint64_t RequestMac(const SipKey& key, std::span<const uint8_t> message) {
  SipHasher hasher(key);
  hasher.Update(kRequestTag);
  hasher.Update(message.first(kRequestSize - 8));
  return hasher.Final();
}

// Reply MAC: SipHash(key, "rep\0" || client nonce || header [0, 24) || entries).
// The nonce binds every batch to this one request: a recorded reply is useless.
uint64_t ReplyMac(const SipKey& key, const Nonce& nonce, std::span<const uint8_t> message) {
  SipHasher hasher(key);
  hasher.Update(kReplyTag);
  hasher.Update(nonce);
  hasher.Update(message.first(kReplyHeaderSize - 8));
  hasher.Update(message.subspan(kReplyHeaderSize));
  return hasher.Final();
}

// Event and ack MACs: SipHash(key, tag || request nonce || record bytes
// before the MAC): bound to the watch connection's request.
uint64_t RecordMac(const SipKey& key, std::span<const uint8_t> tag, const Nonce& nonce,
                   std::span<const uint8_t> record) {
  SipHasher hasher(key);
  hasher.Update(tag);
  hasher.Update(nonce);
  hasher.Update(record.first(record.size() - 8));
  return hasher.Final();
}

// Compares two MACs without an early exit, so that timing does not reveal how
// many leading bytes of a forged MAC were right.
bool MacEqual(uint64_t a, uint64_t b) {
  volatile uint64_t diff = a ^ b;
  return diff == 0;
}

// The checks every watch record (event, ack) starts with, in this order:
// magic, version, exact size, the MAC over everything before it (under the
// connection's key and nonce), then the reserved word at 12. The layout
// past them is the caller's.
WireError CheckWatchRecord(std::span<const uint8_t> message, uint32_t magic, size_t size,
                           std::span<const uint8_t> tag, const Nonce& nonce, const SipKey& key) {
  if (message.size() < 8) return WireError::kTooShort;
  const uint8_t* p = message.data();
  if (Get32(p) != magic) return WireError::kBadMagic;
  if (Get16(p + 4) != kVersion) return WireError::kBadVersion;
  if (message.size() != size) return WireError::kBadLength;
  if (!MacEqual(RecordMac(key, tag, nonce, message), Get64(p + size - 8)))
    return WireError::kBadMac;
  if (Get32(p + 12) != 0) return WireError::kBadReserved;
  return WireError::kOk;
}

// The header every watch record (event, ack) starts with: magic, version,
// the record's 16-bit field at 6 (event kind, ack status), its sequence, and
// the reserved word at 12. CheckWatchRecord reads it back.
void PutWatchHeader(uint8_t* p, uint32_t magic, uint16_t field, uint32_t sequence) {
  Put32(p + 0, magic);
  Put16(p + 4, kVersion);
  Put16(p + 6, field);
  Put32(p + 8, sequence);
  Put32(p + 12, 0);  // reserved
}

// The MAC in a watch record's last 8 bytes, over everything before it.
template <size_t kSize>
void SealWatchRecord(std::array<uint8_t, kSize>& record, std::span<const uint8_t> tag,
                     const Nonce& nonce, const SipKey& key) {
  Put64(record.data() + kSize - 8, RecordMac(key, tag, nonce, record));
}

// The fields every event has, at 0..40 (the header, base, size, generation);
// an announcement's handle follows them.
void PutEventFields(uint8_t* p, const Event& event) {
  PutWatchHeader(p, kEventMagic, static_cast<uint16_t>(event.kind), event.sequence);
  Put64(p + 16, event.base);
  Put64(p + 24, event.size);
  Put64(p + 32, event.generation);
}

}  // namespace

uint64_t Capability(const SipKey& secret, const HandleFields& f) {
  uint8_t bytes[42];
  Put32(bytes + 0, f.exporter_pid);
  Put32(bytes + 4, f.generation);
  Put16(bytes + 8, f.rank_slot);
  Put64(bytes + 10, f.address);
  Put64(bytes + 18, f.chunk_base);
  Put64(bytes + 26, f.chunk_size);
  Put64(bytes + 34, f.region_base);
  SipHasher hasher(secret);
  hasher.Update(kCapabilityTag);
  hasher.Update(bytes);
  const uint64_t capability = hasher.Final();
  return capability != 0 ? capability : 1;  // 0 is no handle's: the decoder refuses it
}

SipKey DeriveKey(uint64_t capability, uint32_t pid) {
  return SipKey{capability, static_cast<uint64_t>(pid)};
}

const char* WireErrorName(WireError error) {
  switch (error) {
    case WireError::kOk:
      return "ok";
    case WireError::kTooShort:
      return "too short";
    case WireError::kBadMagic:
      return "bad magic";
    case WireError::kBadVersion:
      return "unknown version";
    case WireError::kBadLength:
      return "bad length";
    case WireError::kBadReserved:
      return "reserved field not zero";
    case WireError::kBadLayout:
      return "inconsistent fields";
    case WireError::kBadMac:
      return "MAC does not verify";
  }
  return "unknown wire error";
}

std::array<uint8_t, kRequestSize> EncodeRequest(const Request& request, const SipKey& key) {
  std::array<uint8_t, kRequestSize> out{};
  uint8_t* p = out.data();
  Put32(p + 0, kRequestMagic);
  Put16(p + 4, kVersion);
  Put16(p + 6, request.flags);
  Put32(p + 8, request.handle.exporter_pid);
  Put32(p + 12, request.follower);
  std::copy(request.nonce.begin(), request.nonce.end(), p + 16);
  Put64(p + 32, request.handle.address);
  Put64(p + 40, request.handle.chunk_base);
  Put64(p + 48, request.handle.chunk_size);
  Put64(p + 56, request.handle.region_base);
  Put32(p + 64, request.handle.generation);
  Put16(p + 68, request.handle.rank_slot);
  Put16(p + 70, 0);  // reserved
  Put64(p + 72, RequestMac(key, out));
  return out;
}

WireError ParseRequestPreamble(std::span<const uint8_t> message, RequestPreamble* out) {
  if (message.size() < kRequestPreambleSize) return WireError::kTooShort;
  const uint8_t* p = message.data();
  if (Get32(p) != kRequestMagic) return WireError::kBadMagic;
  out->version = Get16(p + 4);
  out->exporter_pid = Get32(p + 8);
  std::copy(p + 16, p + 32, out->nonce.begin());
  return WireError::kOk;
}

bool PeekRequestFields(std::span<const uint8_t> message, Request* out) {
  RequestPreamble preamble;
  if (ParseRequestPreamble(message, &preamble) != WireError::kOk || preamble.version != kVersion ||
      message.size() < kRequestSize)
    return false;
  const uint8_t* p = message.data();
  out->flags = Get16(p + 6);
  out->handle.exporter_pid = preamble.exporter_pid;
  out->follower = Get32(p + 12);
  out->nonce = preamble.nonce;
  out->handle.address = Get64(p + 32);
  out->handle.chunk_base = Get64(p + 40);
  out->handle.chunk_size = Get64(p + 48);
  out->handle.region_base = Get64(p + 56);
  out->handle.generation = Get32(p + 64);
  out->handle.rank_slot = Get16(p + 68);
  return true;
}

WireError ReadRequestFields(std::span<const uint8_t> message, Request* out) {
  RequestPreamble preamble;
  if (WireError e = ParseRequestPreamble(message, &preamble); e != WireError::kOk) return e;
  if (preamble.version != kVersion) return WireError::kBadVersion;
  if (message.size() != kRequestSize) return WireError::kBadLength;
  const uint8_t* p = message.data();
  // A watch request names the follower its connection is kept for.
  // Announcements go on the watch connection: without one, none is asked.
  const uint16_t flags = Get16(p + 6);
  const bool needs_follower = (flags & kRequestFlagWatch) != 0;
  const bool announce_alone =
      (flags & kRequestFlagAnnounce) != 0 && (flags & kRequestFlagWatch) == 0;
  if ((flags & ~kKnownRequestFlags) != 0 || Get16(p + 70) != 0 ||
      (needs_follower && Get32(p + 12) == 0) || announce_alone)
    return WireError::kBadReserved;
  PeekRequestFields(message, out);
  return WireError::kOk;
}

WireError ParseRequest(std::span<const uint8_t> message, const SipKey& secret, Request* out) {
  Request claimed;
  if (WireError e = ReadRequestFields(message, &claimed); e != WireError::kOk) return e;
  const SipKey key = KeyFor(secret, claimed.handle);
  if (!MacEqual(RequestMac(key, message), Get64(message.data() + 72))) return WireError::kBadMac;
  *out = claimed;
  return WireError::kOk;
}

uint32_t BatchCount(uint32_t total_chunks) {
  if (total_chunks == 0) return 1;
  return static_cast<uint32_t>((total_chunks + kMaxChunksPerBatch - 1) / kMaxChunksPerBatch);
}

std::vector<uint8_t> EncodeReply(const Nonce& nonce, const SipKey& key, const ReplyHeader& header,
                                 std::span<const ReplyEntry> entries) {
  constexpr size_t entry_size = kReplyEntrySize;
  std::vector<uint8_t> out(kReplyHeaderSize + entries.size() * entry_size, 0);
  uint8_t* p = out.data();
  Put32(p + 0, kReplyMagic);
  Put16(p + 4, kVersion);
  Put16(p + 6, header.status);
  Put32(p + 8, header.total_chunks);
  Put32(p + 12, header.batch_index);
  Put32(p + 16, header.batch_count);
  Put32(p + 20, static_cast<uint32_t>(entries.size()));
  for (size_t i = 0; i < entries.size(); ++i) {
    uint8_t* e = p + kReplyHeaderSize + i * entry_size;
    Put64(e + 0, entries[i].address);
    Put64(e + 8, entries[i].size);
    Put32(e + 16, entries[i].generation);
    Put32(e + 20, 0);  // the generation's upper half
  }
  Put64(p + 24, ReplyMac(key, nonce, out));
  return out;
}

WireError ParseReply(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                     ReplyHeader* header, std::vector<ReplyEntry>* entries) {
  constexpr size_t entry_size = kReplyEntrySize;
  if (message.size() < kReplyHeaderSize) return WireError::kTooShort;
  const uint8_t* p = message.data();
  if (Get32(p) != kReplyMagic) return WireError::kBadMagic;
  ReplyHeader h;
  h.version = Get16(p + 4);
  if (h.version != kVersion) return WireError::kBadVersion;
  h.status = Get16(p + 6);
  h.total_chunks = Get32(p + 8);
  h.batch_index = Get32(p + 12);
  h.batch_count = Get32(p + 16);
  h.entry_count = Get32(p + 20);
  *header = h;
  // The MAC first: a record that does not verify says nothing trustworthy,
  // whatever its layout.
  if (!MacEqual(ReplyMac(key, nonce, message), Get64(p + 24))) return WireError::kBadMac;
  if (h.entry_count > kMaxChunksPerBatch ||
      message.size() != kReplyHeaderSize + size_t{h.entry_count} * entry_size) {
    return WireError::kBadLength;
  }
  if (h.status != 0) {
    if (h.total_chunks != 0 || h.batch_index != 0 || h.batch_count != 1 || h.entry_count != 0) {
      return WireError::kBadLayout;
    }
  } else {
    if (h.total_chunks == 0 || h.total_chunks > kMaxTotalChunks) return WireError::kBadLayout;
    if (h.batch_count != BatchCount(h.total_chunks) || h.batch_index >= h.batch_count) {
      return WireError::kBadLayout;
    }
    const uint64_t before = uint64_t{h.batch_index} * kMaxChunksPerBatch;
    const uint64_t expected = std::min<uint64_t>(kMaxChunksPerBatch, h.total_chunks - before);
    if (h.entry_count != expected) return WireError::kBadLayout;
  }
  std::vector<ReplyEntry> parsed(h.entry_count);
  for (size_t i = 0; i < parsed.size(); ++i) {
    const uint8_t* e = p + kReplyHeaderSize + i * entry_size;
    // Generations are 32-bit (the handle's width); the wire keeps 64 bits
    // for them, and a value past 32 is no generation an exporter made.
    if (Get32(e + 20) != 0) return WireError::kBadLayout;
    parsed[i] = ReplyEntry{Get64(e + 0), Get64(e + 8), Get32(e + 16)};
    if (parsed[i].size == 0 || parsed[i].address + parsed[i].size < parsed[i].address) {
      return WireError::kBadLayout;  // empty, or wraps around the address space
    }
  }
  *entries = std::move(parsed);
  return WireError::kOk;
}

std::array<uint8_t, kEventSize> EncodeEvent(const Event& event, const Nonce& nonce,
                                            const SipKey& key) {
  std::array<uint8_t, kEventSize> out{};
  PutEventFields(out.data(), event);
  SealWatchRecord(out, kEventTag, nonce, key);
  return out;
}

std::array<uint8_t, kAnnounceEventSize> EncodeAnnounce(const Event& event, const Nonce& nonce,
                                                       const SipKey& key) {
  std::array<uint8_t, kAnnounceEventSize> out{};
  PutEventFields(out.data(), event);
  std::copy(event.handle.begin(), event.handle.end(), out.data() + 40);
  SealWatchRecord(out, kEventTag, nonce, key);
  return out;
}

WireError ParseEvent(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                     Event* out) {
  // The size picks the layout (and where the MAC is); the kind must agree.
  const size_t size = message.size() == kAnnounceEventSize ? kAnnounceEventSize : kEventSize;
  if (WireError e = CheckWatchRecord(message, kEventMagic, size, kEventTag, nonce, key);
      e != WireError::kOk)
    return e;
  const uint8_t* p = message.data();
  const uint16_t kind = Get16(p + 6);
  if (kind < static_cast<uint16_t>(EventKind::kPause) ||
      kind > static_cast<uint16_t>(EventKind::kAnnounce))
    return WireError::kBadLayout;
  Event event;
  event.kind = static_cast<EventKind>(kind);
  if ((event.kind == EventKind::kAnnounce) != (size == kAnnounceEventSize))
    return WireError::kBadLength;  // an announcement without its handle, or an event with one
  event.sequence = Get32(p + 8);
  event.base = Get64(p + 16);
  event.size = Get64(p + 24);
  const uint64_t generation = Get64(p + 32);  // 32-bit in 64 bits, as a reply entry's
  if (generation > UINT32_MAX) return WireError::kBadLayout;
  event.generation = static_cast<uint32_t>(generation);
  if (event.kind == EventKind::kUnfollowed) {
    if (event.base != 0 || event.size != 0 || event.generation != 0) return WireError::kBadLayout;
  } else if (event.size == 0 || event.base + event.size < event.base) {
    return WireError::kBadLayout;
  }
  if (event.kind == EventKind::kAnnounce)
    std::copy(p + 40, p + 40 + kAnnouncedHandleSize, event.handle.begin());
  *out = event;
  return WireError::kOk;
}

void ResealReplyForTesting(std::span<uint8_t> message, const Nonce& nonce, const SipKey& key) {
  if (message.size() < kReplyHeaderSize) return;
  Put64(message.data() + 24, ReplyMac(key, nonce, message));
}

void ResealEventForTesting(std::span<uint8_t> message, const Nonce& nonce, const SipKey& key) {
  if (message.size() != kEventSize && message.size() != kAnnounceEventSize) return;
  Put64(message.data() + message.size() - 8, RecordMac(key, kEventTag, nonce, message));
}

std::array<uint8_t, kAckSize> EncodeAck(const Ack& ack, const Nonce& nonce, const SipKey& key) {
  std::array<uint8_t, kAckSize> out{};
  PutWatchHeader(out.data(), kAckMagic, static_cast<uint16_t>(ack.status), ack.sequence);
  SealWatchRecord(out, kAckTag, nonce, key);
  return out;
}

WireError ParseAck(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                   Ack* out) {
  if (WireError e = CheckWatchRecord(message, kAckMagic, kAckSize, kAckTag, nonce, key);
      e != WireError::kOk)
    return e;
  const uint8_t* p = message.data();
  const uint16_t status = Get16(p + 6);
  if (status > static_cast<uint16_t>(AckStatus::kFailed)) return WireError::kBadLayout;
  out->sequence = Get32(p + 8);
  out->status = static_cast<AckStatus>(status);
  return WireError::kOk;
}

}  // namespace vmmipc::transport::wire
