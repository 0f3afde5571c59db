// Protocol records: round trips, fixed layouts, MAC coverage of every byte,
// and each malformed case the parsers must reject.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "transport/wire.h"

namespace vmmipc::transport::wire {
namespace {

const SipKey kKey = DeriveKey(0x1122334455667788ULL, 4321);          // replies' key in these tests
const SipKey kSecret{0x5eed5eed12345678ULL, 0x0123456789abcdefULL};  // the exporter's

Request SampleRequest() {
  Request r;
  r.handle.exporter_pid = 4321;
  for (size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<uint8_t>(0xa0 + i);
  r.handle.address = 0x7f0000201000ULL;
  r.handle.chunk_base = 0x7f0000200000ULL;
  r.handle.chunk_size = 0x200000;
  r.handle.region_base = 0x7f0000000000ULL;
  r.handle.generation = 77;
  r.handle.rank_slot = 3;
  return r;
}

// A request as a holder of its handle MACs it.
std::array<uint8_t, kRequestSize> Encoded(const Request& r) {
  return EncodeRequest(r, KeyFor(kSecret, r.handle));
}

Nonce SampleNonce() { return SampleRequest().nonce; }

std::vector<ReplyEntry> Entries(size_t count, uint64_t base = 0x300000000000ULL) {
  std::vector<ReplyEntry> e(count);
  for (size_t i = 0; i < count; ++i)
    e[i] = {base + i * 0x200000, 0x200000, static_cast<uint32_t>(1000 + i)};
  return e;
}

ReplyHeader Header(uint16_t status, uint32_t total, uint32_t index, uint32_t count) {
  ReplyHeader h;
  h.status = status;
  h.total_chunks = total;
  h.batch_index = index;
  h.batch_count = count;
  return h;
}

TEST(TransportWire, RequestRoundTrip) {
  const Request in = SampleRequest();
  const auto bytes = Encoded(in);
  Request out;
  ASSERT_EQ(ParseRequest(bytes, kSecret, &out), WireError::kOk);
  EXPECT_EQ(out.handle.exporter_pid, in.handle.exporter_pid);
  EXPECT_EQ(out.nonce, in.nonce);
  EXPECT_EQ(out.handle.address, in.handle.address);
  EXPECT_EQ(out.handle.chunk_base, in.handle.chunk_base);
  EXPECT_EQ(out.handle.chunk_size, in.handle.chunk_size);
  EXPECT_EQ(out.handle.region_base, in.handle.region_base);
  EXPECT_EQ(out.handle.generation, in.handle.generation);
  EXPECT_EQ(out.handle.rank_slot, in.handle.rank_slot);
}

TEST(TransportWire, RequestLayoutIsFixedLittleEndian) {
  const auto b = Encoded(SampleRequest());
  ASSERT_EQ(b.size(), 80u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "VMRQ");
  EXPECT_EQ(b[4], 2);  // version
  EXPECT_EQ(b[5], 0);
  EXPECT_EQ(b[6], 0);  // flags
  EXPECT_EQ(b[7], 0);
  EXPECT_EQ(b[8], 4321 & 0xff);
  EXPECT_EQ(b[9], 4321 >> 8);
  for (int i = 12; i < 16; ++i) EXPECT_EQ(b[i], 0) << i;  // reserved
  EXPECT_EQ(b[16], 0xa0);                                 // nonce
  EXPECT_EQ(b[32], 0x00);                                 // address, low byte first
  EXPECT_EQ(b[33], 0x10);
  EXPECT_EQ(b[34], 0x20);
  EXPECT_EQ(b[50], 0x20);  // chunk size 0x200000
  EXPECT_EQ(b[61], 0x7f);  // region base 0x7f0000000000
  EXPECT_EQ(b[64], 77);    // generation
  EXPECT_EQ(b[68], 3);     // rank slot
  EXPECT_EQ(b[70], 0);     // reserved
  EXPECT_EQ(b[71], 0);
  // Deterministic: every byte defined.
  EXPECT_EQ(Encoded(SampleRequest()), b);
}

TEST(TransportWire, RequestEveryBitIsCovered) {
  const auto good = Encoded(SampleRequest());
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      Request out;
      EXPECT_NE(ParseRequest(bad, kSecret, &out), WireError::kOk)
          << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(TransportWire, RequestOfAnotherSecretOrFieldsIsBadMac) {
  const Request in = SampleRequest();
  Request out;
  // Another process's secret (a pid reused by another vmmipc process).
  EXPECT_EQ(ParseRequest(Encoded(in), SipKey{kSecret.k0, kSecret.k1 + 1}, &out),
            WireError::kBadMac);
  // A handle edited in any field, MAC'd with the original handle's key.
  const SipKey genuine = KeyFor(kSecret, in.handle);
  std::vector<Request> edits(7, in);
  edits[0].handle.address += 0x1000;
  edits[1].handle.chunk_base += 0x200000;
  edits[2].handle.chunk_size *= 2;
  edits[3].handle.region_base -= 0x200000;
  edits[4].handle.generation += 1;
  edits[5].handle.rank_slot = 1;
  edits[6].handle.exporter_pid += 1;
  for (size_t i = 0; i < edits.size(); ++i)
    EXPECT_EQ(ParseRequest(EncodeRequest(edits[i], genuine), kSecret, &out), WireError::kBadMac)
        << "edit " << i;
}

TEST(TransportWire, CapabilityCoversEveryFieldAndIsNeverZero) {
  const HandleFields base = SampleRequest().handle;
  const uint64_t cap = Capability(kSecret, base);
  EXPECT_NE(cap, 0u);
  EXPECT_EQ(Capability(kSecret, base), cap);
  std::vector<HandleFields> edits(7, base);
  edits[0].exporter_pid ^= 1;
  edits[1].generation ^= 1;
  edits[2].rank_slot ^= 1;
  edits[3].address ^= 1;
  edits[4].chunk_base ^= 1;
  edits[5].chunk_size ^= 1;
  edits[6].region_base ^= 1;
  for (size_t i = 0; i < edits.size(); ++i) EXPECT_NE(Capability(kSecret, edits[i]), cap) << i;
  EXPECT_NE(Capability(SipKey{kSecret.k0 ^ 1, kSecret.k1}, base), cap);
  EXPECT_EQ(KeyFor(kSecret, base).k0, cap);
  EXPECT_EQ(KeyFor(kSecret, base).k1, base.exporter_pid);
}

TEST(TransportWire, RequestMalformed) {
  const auto good = Encoded(SampleRequest());
  Request out;
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 0), kSecret, &out),
            WireError::kTooShort);
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 31), kSecret, &out),
            WireError::kTooShort);
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 79), kSecret, &out),
            WireError::kBadLength);
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.push_back(0);
  EXPECT_EQ(ParseRequest(longer, kSecret, &out), WireError::kBadLength);

  auto magic = good;
  magic[0] = 'X';
  EXPECT_EQ(ParseRequest(magic, kSecret, &out), WireError::kBadMagic);
  auto flags = good;
  flags[6] = 2;  // a flag no version declares
  EXPECT_EQ(ParseRequest(flags, kSecret, &out), WireError::kBadReserved);
  flags[6] = kRequestFlagWatch;  // declared, but without a follower (bytes 12..16)
  EXPECT_EQ(ParseRequest(flags, kSecret, &out), WireError::kBadReserved);
  flags[12] = 1;  // with one: the MAC covers both
  EXPECT_EQ(ParseRequest(flags, kSecret, &out), WireError::kBadMac);
  auto reserved_tail = good;
  reserved_tail[71] = 1;
  EXPECT_EQ(ParseRequest(reserved_tail, kSecret, &out), WireError::kBadReserved);
  auto mac = good;
  mac[79] ^= 0x80;
  EXPECT_EQ(ParseRequest(mac, kSecret, &out), WireError::kBadMac);
  // What such requests claim stays readable, for the key of the refusal.
  Request claimed;
  ASSERT_TRUE(PeekRequestFields(reserved_tail, &claimed));
  EXPECT_EQ(claimed.handle.address, SampleRequest().handle.address);
  EXPECT_TRUE(PeekRequestFields(longer, &claimed));
  EXPECT_FALSE(PeekRequestFields(std::span<const uint8_t>(good.data(), 79), &claimed));
}

TEST(TransportWire, UnknownRequestVersionStillYieldsItsNonce) {
  for (uint8_t version : {1, 3}) {  // the previous layout and a future one
    auto other = Encoded(SampleRequest());
    other[4] = version;
    Request out;
    EXPECT_EQ(ParseRequest(other, kSecret, &out), WireError::kBadVersion);
    // Another version may be longer or shorter; its preamble is still readable.
    std::vector<uint8_t> resized(other.begin(), other.end());
    resized.resize(version == 1 ? 64 : 200, 0xee);
    EXPECT_EQ(ParseRequest(resized, kSecret, &out), WireError::kBadVersion);
    RequestPreamble preamble;
    ASSERT_EQ(ParseRequestPreamble(resized, &preamble), WireError::kOk);
    EXPECT_EQ(preamble.version, version);
    EXPECT_EQ(preamble.nonce, SampleRequest().nonce);
    Request claimed;
    EXPECT_FALSE(PeekRequestFields(resized, &claimed));
  }
}

TEST(TransportWire, ReplyRoundTrip) {
  const auto entries = Entries(5);
  const auto bytes = EncodeReply(SampleNonce(), kKey, Header(0, 5, 0, 1), entries);
  ASSERT_EQ(bytes.size(), kReplyHeaderSize + 5 * kReplyEntrySize);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "VMRP");
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  ASSERT_EQ(ParseReply(bytes, SampleNonce(), kKey, &h, &out), WireError::kOk);
  EXPECT_EQ(h.version, kVersion);
  EXPECT_EQ(h.status, 0);
  EXPECT_EQ(h.total_chunks, 5u);
  EXPECT_EQ(h.batch_index, 0u);
  EXPECT_EQ(h.batch_count, 1u);
  EXPECT_EQ(h.entry_count, 5u);
  ASSERT_EQ(out.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(out[i].address, entries[i].address);
    EXPECT_EQ(out[i].size, entries[i].size);
    EXPECT_EQ(out[i].generation, entries[i].generation);
  }
}

TEST(TransportWire, ReplyBatchesOf600Chunks) {
  EXPECT_EQ(BatchCount(0), 1u);
  EXPECT_EQ(BatchCount(1), 1u);
  EXPECT_EQ(BatchCount(253), 1u);
  EXPECT_EQ(BatchCount(254), 2u);
  EXPECT_EQ(BatchCount(600), 3u);
  const auto all = Entries(600);
  const size_t sizes[3] = {253, 253, 94};
  size_t begin = 0;
  for (uint32_t b = 0; b < 3; ++b) {
    std::span<const ReplyEntry> part(all.data() + begin, sizes[b]);
    const auto bytes = EncodeReply(SampleNonce(), kKey, Header(0, 600, b, 3), part);
    ReplyHeader h;
    std::vector<ReplyEntry> out;
    ASSERT_EQ(ParseReply(bytes, SampleNonce(), kKey, &h, &out), WireError::kOk) << b;
    EXPECT_EQ(out.size(), sizes[b]);
    EXPECT_EQ(out.front().address, all[begin].address);
    begin += sizes[b];
  }
  EXPECT_LE(kMaxReplySize, 8192u);
}

TEST(TransportWire, RefusalRoundTrip) {
  const auto bytes = EncodeReply(SampleNonce(), kKey, Header(4, 0, 0, 1), {});
  EXPECT_EQ(bytes.size(), kReplyHeaderSize);
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  ASSERT_EQ(ParseReply(bytes, SampleNonce(), kKey, &h, &out), WireError::kOk);
  EXPECT_EQ(h.status, 4);
  EXPECT_TRUE(out.empty());
}

TEST(TransportWire, ReplyMacBindsNonceKeyAndEveryBit) {
  const auto good = EncodeReply(SampleNonce(), kKey, Header(0, 3, 0, 1), Entries(3));
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  Nonce other = SampleNonce();
  other[15] ^= 1;
  EXPECT_EQ(ParseReply(good, other, kKey, &h, &out), WireError::kBadMac);
  EXPECT_EQ(ParseReply(good, SampleNonce(), DeriveKey(1, 4321), &h, &out), WireError::kBadMac);
  for (size_t byte = 0; byte < good.size(); ++byte) {
    auto bad = good;
    bad[byte] ^= 0x01;
    EXPECT_NE(ParseReply(bad, SampleNonce(), kKey, &h, &out), WireError::kOk) << byte;
  }
  // Dropping or adding bytes breaks the MAC too.
  std::vector<uint8_t> shorter(good.begin(), good.end() - kReplyEntrySize);
  EXPECT_EQ(ParseReply(shorter, SampleNonce(), kKey, &h, &out), WireError::kBadMac);
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_EQ(ParseReply(longer, SampleNonce(), kKey, &h, &out), WireError::kBadMac);
}

TEST(TransportWire, BadMacStillShowsTheClaimedHeader) {
  const auto bytes = EncodeReply(SampleNonce(), DeriveKey(9, 9), Header(1, 0, 0, 1), {});
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  ASSERT_EQ(ParseReply(bytes, SampleNonce(), kKey, &h, &out), WireError::kBadMac);
  EXPECT_EQ(h.status, 1);
  EXPECT_EQ(h.entry_count, 0u);
  EXPECT_TRUE(out.empty());
}

TEST(TransportWire, ReplyMalformed) {
  const Nonce n = SampleNonce();
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  auto expect = [&](const std::vector<uint8_t>& bytes, WireError error, const char* what) {
    EXPECT_EQ(ParseReply(bytes, n, kKey, &h, &out), error) << what;
  };
  const auto good = EncodeReply(n, kKey, Header(0, 1, 0, 1), Entries(1));
  expect(std::vector<uint8_t>(good.begin(), good.begin() + 31), WireError::kTooShort, "short");
  auto magic = good;
  magic[3] = 0;
  expect(magic, WireError::kBadMagic, "magic");
  auto version = good;
  version[4] = 9;
  expect(version, WireError::kBadVersion, "version");
  // Consistently MAC'd but inconsistent records.
  expect(EncodeReply(n, kKey, Header(0, 254, 0, 2), Entries(254)), WireError::kBadLength,
         "more entries than one batch may carry");
  expect(EncodeReply(n, kKey, Header(0, 0, 0, 1), {}), WireError::kBadLayout, "grant of nothing");
  expect(EncodeReply(n, kKey, Header(0, 600, 0, 3), Entries(10)), WireError::kBadLayout,
         "entry count not what the batch should hold");
  expect(EncodeReply(n, kKey, Header(0, 600, 0, 2), Entries(253)), WireError::kBadLayout,
         "batch count wrong for the total");
  expect(EncodeReply(n, kKey, Header(0, 600, 3, 3), Entries(94)), WireError::kBadLayout,
         "batch index past the end");
  expect(EncodeReply(n, kKey, Header(0, kMaxTotalChunks + 1, 0, BatchCount(kMaxTotalChunks + 1)),
                     Entries(253)),
         WireError::kBadLayout, "too many chunks");
  expect(EncodeReply(n, kKey, Header(3, 0, 0, 1), Entries(1)), WireError::kBadLayout,
         "refusal with entries");
  expect(EncodeReply(n, kKey, Header(3, 1, 0, 1), {}), WireError::kBadLayout,
         "refusal with a total");
  expect(EncodeReply(n, kKey, Header(3, 0, 0, 2), {}), WireError::kBadLayout,
         "refusal in two batches");
  std::vector<ReplyEntry> empty_chunk = {{0x1000, 0, 1}};
  expect(EncodeReply(n, kKey, Header(0, 1, 0, 1), empty_chunk), WireError::kBadLayout,
         "zero-size chunk");
  std::vector<ReplyEntry> wrapping = {{~0ULL - 0xfff, 0x2000, 1}};
  expect(EncodeReply(n, kKey, Header(0, 1, 0, 1), wrapping), WireError::kBadLayout,
         "chunk wrapping around");
}

TEST(TransportWire, KeysDifferByCapabilityAndPid) {
  const SipKey a = DeriveKey(1, 2);
  const SipKey b = DeriveKey(1, 3);
  const SipKey c = DeriveKey(2, 2);
  EXPECT_FALSE(a.k0 == b.k0 && a.k1 == b.k1);
  EXPECT_FALSE(a.k0 == c.k0 && a.k1 == c.k1);
}

TEST(TransportWire, WatchFlagAndFollowerRoundTrip) {
  Request r = SampleRequest();
  r.flags = kRequestFlagWatch;
  r.follower = 0xC0FFEE01u;
  Request out;
  ASSERT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kOk);
  EXPECT_EQ(out.flags, kRequestFlagWatch);
  EXPECT_EQ(out.follower, 0xC0FFEE01u);
  // The follower is MAC'd: another follower's grants cannot be claimed by
  // editing it.
  auto edited = Encoded(r);
  edited[12] ^= 1;
  EXPECT_EQ(ParseRequest(edited, kSecret, &out), WireError::kBadMac);
}

Event SampleEvent() {
  Event e;
  e.kind = EventKind::kResume;
  e.sequence = 7;
  e.base = 0x200000400000ULL;
  e.size = 0x200000;
  e.generation = 0x80000005ULL;
  return e;
}

TEST(TransportWire, AnUnfollowedEventRoundTrips) {
  Event e;
  e.kind = EventKind::kUnfollowed;
  e.sequence = 9;
  Event out;
  ASSERT_EQ(ParseEvent(EncodeEvent(e, SampleNonce(), kKey), SampleNonce(), kKey, &out),
            WireError::kOk);
  EXPECT_EQ(out.kind, EventKind::kUnfollowed);
  e.base = 0x200000;  // it names no chunk
  EXPECT_EQ(ParseEvent(EncodeEvent(e, SampleNonce(), kKey), SampleNonce(), kKey, &out),
            WireError::kBadLayout);
}

TEST(TransportWire, EventAndAckRoundTrip) {
  const auto bytes = EncodeEvent(SampleEvent(), SampleNonce(), kKey);
  Event event;
  ASSERT_EQ(ParseEvent(bytes, SampleNonce(), kKey, &event), WireError::kOk);
  EXPECT_EQ(event.kind, EventKind::kResume);
  EXPECT_EQ(event.sequence, 7u);
  EXPECT_EQ(event.base, 0x200000400000ULL);
  EXPECT_EQ(event.size, 0x200000u);
  EXPECT_EQ(event.generation, 0x80000005ULL);
  const auto ack_bytes = EncodeAck({7, AckStatus::kNotHeld}, SampleNonce(), kKey);
  Ack ack;
  ASSERT_EQ(ParseAck(ack_bytes, SampleNonce(), kKey, &ack), WireError::kOk);
  EXPECT_EQ(ack.sequence, 7u);
  EXPECT_EQ(ack.status, AckStatus::kNotHeld);
}

// Events and acks are bound to their watch connection (its request's key
// and nonce), cover every byte, and cannot stand in for each other.
TEST(TransportWire, EventAndAckMalformed) {
  const auto good = EncodeEvent(SampleEvent(), SampleNonce(), kKey);
  Event event;
  Nonce other = SampleNonce();
  other[0] ^= 1;
  EXPECT_EQ(ParseEvent(good, other, kKey, &event), WireError::kBadMac);
  EXPECT_EQ(ParseEvent(good, SampleNonce(), DeriveKey(1, 4321), &event), WireError::kBadMac);
  for (size_t i = 8; i < kEventSize; ++i) {
    auto edited = good;
    edited[i] ^= 0x10;
    EXPECT_EQ(ParseEvent(edited, SampleNonce(), kKey, &event), WireError::kBadMac) << "byte " << i;
  }
  EXPECT_EQ(ParseEvent(std::span(good).first(20), SampleNonce(), kKey, &event),
            WireError::kBadLength);
  Event bad_kind = SampleEvent();
  bad_kind.kind = static_cast<EventKind>(5);
  EXPECT_EQ(ParseEvent(EncodeEvent(bad_kind, SampleNonce(), kKey), SampleNonce(), kKey, &event),
            WireError::kBadLayout);
  Event empty = SampleEvent();
  empty.size = 0;
  EXPECT_EQ(ParseEvent(EncodeEvent(empty, SampleNonce(), kKey), SampleNonce(), kKey, &event),
            WireError::kBadLayout);
  Ack ack;
  EXPECT_EQ(ParseAck(good, SampleNonce(), kKey, &ack), WireError::kBadMagic);
  const auto ack_bytes = EncodeAck({1, AckStatus::kDone}, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(ack_bytes, SampleNonce(), kKey, &event), WireError::kBadMagic);
  EXPECT_EQ(ParseAck(ack_bytes, other, kKey, &ack), WireError::kBadMac);
  Ack bad_status{1, static_cast<AckStatus>(9)};
  EXPECT_EQ(ParseAck(EncodeAck(bad_status, SampleNonce(), kKey), SampleNonce(), kKey, &ack),
            WireError::kBadLayout);
}

// Generations are 32-bit; the wire's 64-bit field above that is malformed,
// even under a good MAC (resealed after the edit).
TEST(TransportWire, AGenerationPast32BitsIsMalformed) {
  auto reply = EncodeReply(SampleNonce(), kKey, Header(0, 2, 0, 1), Entries(2));
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  reply[kReplyHeaderSize + kReplyEntrySize + 16 + 4] = 1;  // entry 1's generation, bit 32
  ResealReplyForTesting(reply, SampleNonce(), kKey);
  EXPECT_EQ(ParseReply(reply, SampleNonce(), kKey, &h, &out), WireError::kBadLayout);
  reply[kReplyHeaderSize + kReplyEntrySize + 16 + 4] = 0;
  ResealReplyForTesting(reply, SampleNonce(), kKey);
  EXPECT_EQ(ParseReply(reply, SampleNonce(), kKey, &h, &out), WireError::kOk);

  auto event = EncodeEvent(SampleEvent(), SampleNonce(), kKey);
  Event parsed;
  event[32 + 7] = 0x80;  // the generation's top byte
  ResealEventForTesting(event, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(event, SampleNonce(), kKey, &parsed), WireError::kBadLayout);
  event[32 + 7] = 0;
  ResealEventForTesting(event, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(event, SampleNonce(), kKey, &parsed), WireError::kOk);
}

// A reply entry's upper generation half is zero: anything else (the entry
// kinds of the retired prefetch layout among them) is malformed.
TEST(TransportWire, AReplyEntryWithTheUpperGenerationHalfSetIsMalformed) {
  const std::vector<ReplyEntry> entries = Entries(4);
  auto plain = EncodeReply(SampleNonce(), kKey, Header(0, 4, 0, 1), entries);
  ASSERT_EQ(plain.size(), kReplyHeaderSize + 4 * kReplyEntrySize);
  ReplyHeader h;
  std::vector<ReplyEntry> out;
  EXPECT_EQ(ParseReply(plain, SampleNonce(), kKey, &h, &out), WireError::kOk);
  plain[kReplyHeaderSize + 20] = 1;
  ResealReplyForTesting(plain, SampleNonce(), kKey);
  EXPECT_EQ(ParseReply(plain, SampleNonce(), kKey, &h, &out), WireError::kBadLayout);
  EXPECT_LE(kMaxReplySize, 8192u);
}

// The retired prefetch flag (bit 2) is no flag of this version: a request
// that sets it is malformed, with or without a follower.
TEST(TransportWire, TheRetiredPrefetchFlagIsMalformed) {
  Request r = SampleRequest();
  r.flags = kRequestFlagRetiredPrefetch;
  r.follower = 9;
  Request out;
  EXPECT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kBadReserved);
  r.flags = 8;  // no such flag
  EXPECT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kBadReserved);
  r.flags = 0;
  EXPECT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kOk);
}

Event SampleAnnounce() {
  Event e = SampleEvent();
  e.kind = EventKind::kAnnounce;
  for (size_t i = 0; i < e.handle.size(); ++i) e.handle[i] = static_cast<uint8_t>(0x40 + i);
  return e;
}

// Announcements (issue 37): the announce flag asks for them on a watch
// request, and means nothing (a malformed request) without one.
TEST(TransportWire, TheAnnounceFlagGoesOnlyWithTheWatchFlag) {
  Request r = SampleRequest();
  r.follower = 9;
  Request out;
  for (const int flags : {kRequestFlagWatch | kRequestFlagAnnounce}) {
    r.flags = static_cast<uint16_t>(flags);
    ASSERT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kOk) << flags;
    EXPECT_EQ(out.flags, flags);
  }
  for (const int flags :
       {kRequestFlagAnnounce | 0, kRequestFlagRetiredPrefetch | kRequestFlagAnnounce,
        kRequestFlagWatch | kRequestFlagRetiredPrefetch | kRequestFlagAnnounce}) {
    r.flags = static_cast<uint16_t>(flags);
    EXPECT_EQ(ParseRequest(Encoded(r), kSecret, &out), WireError::kBadReserved) << flags;
  }
}

// A kAnnounce event is an event's 40 bytes, the 64-byte handle, the MAC over
// all 104 before it.
TEST(TransportWire, AnAnnounceEventRoundTripsWithItsHandle) {
  static_assert(kAnnounceEventSize == 112);
  const auto bytes = EncodeAnnounce(SampleAnnounce(), SampleNonce(), kKey);
  ASSERT_EQ(bytes.size(), kAnnounceEventSize);
  const auto plain = EncodeEvent(SampleEvent(), SampleNonce(), kKey);
  // The same header and fields as a plain event's (but the kind).
  EXPECT_TRUE(std::equal(bytes.begin() + 8, bytes.begin() + 40, plain.begin() + 8));
  EXPECT_EQ(bytes[6], 4);
  EXPECT_EQ(bytes[40], 0x40);
  EXPECT_EQ(bytes[103], 0x40 + 63);
  Event event;
  ASSERT_EQ(ParseEvent(bytes, SampleNonce(), kKey, &event), WireError::kOk);
  EXPECT_EQ(event.kind, EventKind::kAnnounce);
  EXPECT_EQ(event.sequence, 7u);
  EXPECT_EQ(event.base, 0x200000400000ULL);
  EXPECT_EQ(event.size, 0x200000u);
  EXPECT_EQ(event.generation, 0x80000005u);
  EXPECT_EQ(event.handle, SampleAnnounce().handle);
  // A plain event parses with no handle.
  ASSERT_EQ(ParseEvent(plain, SampleNonce(), kKey, &event), WireError::kOk);
  EXPECT_EQ(event.handle, (std::array<uint8_t, kAnnouncedHandleSize>{}));
}

// Each layout carries only its own kinds, every byte of an announcement is
// MAC'd, and what an event may not say an announcement may not either.
TEST(TransportWire, AnAnnounceEventMalformed) {
  const auto good = EncodeAnnounce(SampleAnnounce(), SampleNonce(), kKey);
  Event event;
  Nonce other = SampleNonce();
  other[0] ^= 1;
  EXPECT_EQ(ParseEvent(good, other, kKey, &event), WireError::kBadMac);
  EXPECT_EQ(ParseEvent(good, SampleNonce(), DeriveKey(1, 4321), &event), WireError::kBadMac);
  for (size_t i = 8; i < kAnnounceEventSize; ++i) {
    auto edited = good;
    edited[i] ^= 0x10;
    EXPECT_EQ(ParseEvent(edited, SampleNonce(), kKey, &event), WireError::kBadMac) << "byte " << i;
  }
  // Neither size but the two.
  EXPECT_EQ(ParseEvent(std::span(good).first(kAnnounceEventSize - 1), SampleNonce(), kKey, &event),
            WireError::kBadLength);
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.push_back(0);
  EXPECT_EQ(ParseEvent(longer, SampleNonce(), kKey, &event), WireError::kBadLength);
  // An announcement in the short layout (no handle), a pause in the long one.
  EXPECT_EQ(
      ParseEvent(EncodeEvent(SampleAnnounce(), SampleNonce(), kKey), SampleNonce(), kKey, &event),
      WireError::kBadLength);
  for (EventKind kind : {EventKind::kPause, EventKind::kResume}) {
    Event long_one = SampleEvent();
    long_one.kind = kind;
    EXPECT_EQ(
        ParseEvent(EncodeAnnounce(long_one, SampleNonce(), kKey), SampleNonce(), kKey, &event),
        WireError::kBadLength);
  }
  Event unfollowed;
  unfollowed.kind = EventKind::kUnfollowed;
  EXPECT_EQ(
      ParseEvent(EncodeAnnounce(unfollowed, SampleNonce(), kKey), SampleNonce(), kKey, &event),
      WireError::kBadLength);
  // Unknown kinds, in either layout.
  for (const int kind : {0, 5, 0xffff}) {
    Event unknown = SampleAnnounce();
    unknown.kind = static_cast<EventKind>(kind);
    EXPECT_EQ(ParseEvent(EncodeAnnounce(unknown, SampleNonce(), kKey), SampleNonce(), kKey, &event),
              WireError::kBadLayout)
        << kind;
    EXPECT_EQ(ParseEvent(EncodeEvent(unknown, SampleNonce(), kKey), SampleNonce(), kKey, &event),
              WireError::kBadLayout)
        << kind;
  }
  // Its chunk: not empty, not wrapping, a 32-bit generation (resealed edits).
  Event empty = SampleAnnounce();
  empty.size = 0;
  EXPECT_EQ(ParseEvent(EncodeAnnounce(empty, SampleNonce(), kKey), SampleNonce(), kKey, &event),
            WireError::kBadLayout);
  Event wraps = SampleAnnounce();
  wraps.base = ~uint64_t{0} - 0x1000;
  EXPECT_EQ(ParseEvent(EncodeAnnounce(wraps, SampleNonce(), kKey), SampleNonce(), kKey, &event),
            WireError::kBadLayout);
  auto wide = good;
  wide[32 + 4] = 1;  // the generation's bit 32
  ResealEventForTesting(wide, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(wide, SampleNonce(), kKey, &event), WireError::kBadLayout);
  wide[32 + 4] = 0;
  wide[12] = 1;  // reserved
  ResealEventForTesting(wide, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(wide, SampleNonce(), kKey, &event), WireError::kBadReserved);
  wide[12] = 0;
  ResealEventForTesting(wide, SampleNonce(), kKey);
  EXPECT_EQ(ParseEvent(wide, SampleNonce(), kKey, &event), WireError::kOk);
  // An ack is no announcement, nor the other way round.
  Ack ack;
  EXPECT_EQ(ParseAck(good, SampleNonce(), kKey, &ack), WireError::kBadMagic);
}

}  // namespace
}  // namespace vmmipc::transport::wire
