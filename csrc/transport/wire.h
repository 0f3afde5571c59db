// The protocol records (docs/protocol.md): fixed little-endian layouts for the
// request and the reply batches, their MACs, and the checks that reject every
// malformed record. Pure bytes in, bytes out: no sockets, no fds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/siphash.h"

namespace vmmipc::transport::wire {

inline constexpr uint16_t kVersion = 2;
inline constexpr uint32_t kRequestMagic = 0x51524d56;  // bytes "VMRQ"
inline constexpr uint32_t kReplyMagic = 0x50524d56;    // bytes "VMRP"
inline constexpr uint32_t kEventMagic = 0x56454d56;    // bytes "VMEV"
inline constexpr uint32_t kAckMagic = 0x4b414d56;      // bytes "VMAK"

// Request flags. kRequestFlagWatch: after the reply, keep this connection as
// the watch connection of the request's follower (events about chunks it was
// granted: a pause or resume of a memory saver; docs/protocol.md, "Follow").
inline constexpr uint16_t kRequestFlagWatch = 1;
// Bit 2 (value 2) is retired: it asked for prefetched runs in a reply of
// another layout (vmmipc before VMMIPC_AHEAD). This exporter refuses it as an
// unknown flag (kBadRequest), and an importer of that vmmipc asks again
// without it; this importer never sets it.
inline constexpr uint16_t kRequestFlagRetiredPrefetch = 2;
// kRequestFlagAnnounce: on a watch request only (alone, the request is
// malformed), the importer asks to be told on the watch connection of every
// handle the exporter hands out from then on (kAnnounce events; docs/
// protocol.md, "Announcements"). An older exporter refuses the bit
// (kBadRequest).
inline constexpr uint16_t kRequestFlagAnnounce = 4;
inline constexpr uint16_t kKnownRequestFlags = kRequestFlagWatch | kRequestFlagAnnounce;

// The request's first 32 bytes (magic, version, flags, pid, reserved, nonce)
// keep their layout in every version, so that a server can answer a request
// of a version it does not know with a MAC'd kBadRequest.
inline constexpr size_t kRequestPreambleSize = 32;
inline constexpr size_t kRequestSize = 80;
inline constexpr size_t kReplyHeaderSize = 32;
inline constexpr size_t kReplyEntrySize = 24;
// One fd per entry, so at most the kernel's SCM_MAX_FD (kMaxFdsPerMessage).
inline constexpr size_t kMaxChunksPerBatch = 253;
// Bound on one span, so that a reply cannot ask the client to hold an
// unbounded number of fds and entries.
inline constexpr uint32_t kMaxTotalChunks = 1u << 20;
inline constexpr size_t kMaxReplySize = kReplyHeaderSize + kMaxChunksPerBatch * kReplyEntrySize;

using Nonce = std::array<uint8_t, 16>;

// What a handle names, repeated in every request for it (docs/security.md,
// "What a handle grants"): the one struct of these fields outside the handle's
// codec, from the importer's open (FetchRequest) to the exporter's check of
// the capability; core makes it from a decoded handle (core/handle_fields.h).
struct HandleFields {
  uint32_t exporter_pid = 0;
  uint32_t generation = 0;
  uint16_t rank_slot = 0;
  uint64_t address = 0;
  uint64_t chunk_base = 0;
  uint64_t chunk_size = 0;
  uint64_t region_base = 0;
};
// The handle's capability: SipHash under the exporter's secret (which never
// leaves its process) over every field the handle names, never 0. A handle
// whose fields were edited carries a capability that matches none of them.
uint64_t Capability(const SipKey& secret, const HandleFields& fields);
// The MAC key of every record about one handle: k0 = its capability, k1 =
// the exporter's pid (zero-extended). Only the exporter and holders of that
// handle know it.
SipKey DeriveKey(uint64_t capability, uint32_t pid);
// The exporter's side: the key of a request for `fields`, from its secret.
inline SipKey KeyFor(const SipKey& secret, const HandleFields& fields) {
  return DeriveKey(Capability(secret, fields), fields.exporter_pid);
}

enum class WireError {
  kOk = 0,
  kTooShort,     // shorter than the fixed part
  kBadMagic,     // not a vmmipc record
  kBadVersion,   // a version this side does not speak
  kBadLength,    // length does not match the layout
  kBadReserved,  // a reserved or flags field is not zero
  kBadLayout,    // fields inconsistent with each other (counts, sizes)
  kBadMac,       // the MAC does not verify under this key
};
const char* WireErrorName(WireError error);

struct RequestPreamble {
  uint16_t version = 0;
  uint32_t exporter_pid = 0;
  Nonce nonce{};
};

struct Request {
  uint16_t flags = 0;  // kRequestFlag*
  // Follow: the importer's follower id (random, never 0, one per importer
  // process), under which the exporter records the grant's holder and keeps
  // the watch connection; 0 from an importer that does not follow. Required
  // with kRequestFlagWatch.
  uint32_t follower = 0;
  Nonce nonce{};
  HandleFields handle;  // what the handle names, under whose capability the request is MAC'd
};

// MAC'd under `key`: DeriveKey(the handle's capability, exporter pid).
std::array<uint8_t, kRequestSize> EncodeRequest(const Request& request, const SipKey& key);
// Only magic and size: enough to learn the nonce (and version) of any request.
WireError ParseRequestPreamble(std::span<const uint8_t> message, RequestPreamble* out);
// The fields of a request of this version and size, without the MAC check.
// `out` filled on kOk.
WireError ReadRequestFields(std::span<const uint8_t> message, Request* out);
// What a request of this version claims to name, read at the fixed offsets
// whatever else is wrong with it (reserved bytes, trailing bytes): the key of
// a refusal, so that the holder of that handle can verify the refusal.
// False when the message is too short or of another version.
bool PeekRequestFields(std::span<const uint8_t> message, Request* out);
// Everything, MAC last, under KeyFor(secret, the request's fields): a request
// verifies only when it names exactly what a handle of this exporter named.
// `out` is filled only on kOk.
WireError ParseRequest(std::span<const uint8_t> message, const SipKey& secret, Request* out);

struct ReplyHeader {
  uint16_t version = 0;
  uint16_t status = 0;  // RefuseReason; 0 (kNone) means chunks follow
  uint32_t total_chunks = 0;
  uint32_t batch_index = 0;
  uint32_t batch_count = 0;
  uint32_t entry_count = 0;
};

struct ReplyEntry {
  uint64_t address = 0;
  uint64_t size = 0;
  uint32_t generation = 0;  // 64 bits on the wire (docs/protocol.md), 32 in the handle
};

// Number of messages a reply of `total_chunks` chunks takes (1 for a refusal).
uint32_t BatchCount(uint32_t total_chunks);

// One reply message. For a refusal pass status != 0, total 0, batch 0 of 1,
// no entries.
std::vector<uint8_t> EncodeReply(const Nonce& nonce, const SipKey& key, const ReplyHeader& header,
                                 std::span<const ReplyEntry> entries);
// Checks in this order: size, magic, version (header filled from here on),
// MAC, then length and layout; entries filled only on kOk. On kBadMac the
// header is still filled, so that the caller can see what the record claims.
WireError ParseReply(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                     ReplyHeader* header, std::vector<ReplyEntry>* entries);

// Events on a watch connection, exporter to importer, and their acks. Both
// are MAC'd under the key of the request that opened the connection and its
// nonce, and numbered: a record of another connection, or replayed, fails.
inline constexpr size_t kEventSize = 48;
inline constexpr size_t kAckSize = 24;
// A kAnnounce event carries the 64-byte handle the exporter handed out
// (transport knows no handle codec: core static_asserts the size), between
// the generation and the MAC.
inline constexpr size_t kAnnouncedHandleSize = 64;
inline constexpr size_t kAnnounceEventSize = kEventSize + kAnnouncedHandleSize;

enum class EventKind : uint16_t {
  kPause = 1,   // the exporter unmaps the chunk: drop your mapping of it
  kResume = 2,  // new memory is mapped at the chunk's base: its fd rides along
  // The exporter stops following this importer (it missed more than its
  // backlog holds): drop every mapping of this exporter's memory, which
  // would go stale. Base, size and generation are 0. The last event.
  kUnfollowed = 3,
  // The exporter handed out a handle of the chunk (only to an importer whose
  // watch request had kRequestFlagAnnounce); its bytes ride along (a record
  // of kAnnounceEventSize). The importer acks it at once: kDone, or kNotHeld
  // when it ignores it. An optimisation only: one that is lost (never sent)
  // costs nothing but the speed of a later open.
  kAnnounce = 4,
};

struct Event {
  EventKind kind = EventKind::kPause;
  uint32_t sequence = 0;
  uint64_t base = 0;        // the chunk's base in the exporter
  uint64_t size = 0;        // its size (for kResume: of the new memory)
  uint32_t generation = 0;  // kPause: the generation unmapped; kResume: the new one
  std::array<uint8_t, kAnnouncedHandleSize> handle{};  // kAnnounce only: the handle handed out
};

enum class AckStatus : uint16_t {
  kDone = 0,     // held the chunk, did what the event asked
  kNotHeld = 1,  // holds no mapping of it (closed, or never opened)
  kFailed = 2,   // held it, could not follow (size changed, driver refused)
};

struct Ack {
  uint32_t sequence = 0;
  AckStatus status = AckStatus::kDone;
};

// A pause, resume or unfollowed event (kEventSize).
std::array<uint8_t, kEventSize> EncodeEvent(const Event& event, const Nonce& nonce,
                                            const SipKey& key);
// A kAnnounce event: EncodeEvent's header, sequence and fields, then the
// handle, MAC'd the same way over all of it.
std::array<uint8_t, kAnnounceEventSize> EncodeAnnounce(const Event& event, const Nonce& nonce,
                                                       const SipKey& key);
// Either layout: kEventSize with kind pause, resume or unfollowed, or
// kAnnounceEventSize with kind kAnnounce; a kind in the other's size is
// kBadLength (after the MAC), an unknown kind kBadLayout.
WireError ParseEvent(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                     Event* out);
// For tests that edit a field of an encoded reply or event (of either
// size): its MAC made again over the bytes as they are now.
void ResealReplyForTesting(std::span<uint8_t> message, const Nonce& nonce, const SipKey& key);
void ResealEventForTesting(std::span<uint8_t> message, const Nonce& nonce, const SipKey& key);

std::array<uint8_t, kAckSize> EncodeAck(const Ack& ack, const Nonce& nonce, const SipKey& key);
WireError ParseAck(std::span<const uint8_t> message, const Nonce& nonce, const SipKey& key,
                   Ack* out);

}  // namespace vmmipc::transport::wire
