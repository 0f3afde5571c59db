// Protocol records: round trips, fixed layouts, MAC coverage of every byte,
// and each malformed case the parsers must reject.
#include <gtest/gtest.h>

#include <vector>

#include "transport/wire.h"

namespace vmmipc::transport::wire {
namespace {

const SipKey kKey = DeriveKey(0x1122334455667788ULL, 4321);

Request SampleRequest() {
  Request r;
  r.exporter_pid = 4321;
  for (size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<uint8_t>(0xa0 + i);
  r.address = 0x7f0000201000ULL;
  r.chunk_base = 0x7f0000200000ULL;
  r.generation = 77;
  return r;
}

Nonce SampleNonce() { return SampleRequest().nonce; }

std::vector<ReplyEntry> Entries(size_t count, uint64_t base = 0x300000000000ULL) {
  std::vector<ReplyEntry> e(count);
  for (size_t i = 0; i < count; ++i) e[i] = {base + i * 0x200000, 0x200000, 1000 + i};
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
  const auto bytes = EncodeRequest(in, kKey);
  Request out;
  ASSERT_EQ(ParseRequest(bytes, kKey, &out), WireError::kOk);
  EXPECT_EQ(out.exporter_pid, in.exporter_pid);
  EXPECT_EQ(out.nonce, in.nonce);
  EXPECT_EQ(out.address, in.address);
  EXPECT_EQ(out.chunk_base, in.chunk_base);
  EXPECT_EQ(out.generation, in.generation);
}

TEST(TransportWire, RequestLayoutIsFixedLittleEndian) {
  const auto b = EncodeRequest(SampleRequest(), kKey);
  ASSERT_EQ(b.size(), 64u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "VMRQ");
  EXPECT_EQ(b[4], 1);  // version
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
  EXPECT_EQ(b[48], 77);  // generation
  // Deterministic: every byte defined.
  EXPECT_EQ(EncodeRequest(SampleRequest(), kKey), b);
}

TEST(TransportWire, RequestEveryBitIsCovered) {
  const auto good = EncodeRequest(SampleRequest(), kKey);
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      Request out;
      EXPECT_NE(ParseRequest(bad, kKey, &out), WireError::kOk) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(TransportWire, RequestWrongKeyOrPidIsBadMac) {
  const auto bytes = EncodeRequest(SampleRequest(), kKey);
  Request out;
  EXPECT_EQ(ParseRequest(bytes, DeriveKey(0x1122334455667789ULL, 4321), &out), WireError::kBadMac);
  EXPECT_EQ(ParseRequest(bytes, DeriveKey(0x1122334455667788ULL, 4322), &out), WireError::kBadMac);
}

TEST(TransportWire, RequestMalformed) {
  const auto good = EncodeRequest(SampleRequest(), kKey);
  Request out;
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 0), kKey, &out),
            WireError::kTooShort);
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 31), kKey, &out),
            WireError::kTooShort);
  EXPECT_EQ(ParseRequest(std::span<const uint8_t>(good.data(), 63), kKey, &out),
            WireError::kBadLength);
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.push_back(0);
  EXPECT_EQ(ParseRequest(longer, kKey, &out), WireError::kBadLength);

  auto magic = good;
  magic[0] = 'X';
  EXPECT_EQ(ParseRequest(magic, kKey, &out), WireError::kBadMagic);
  auto flags = good;
  flags[6] = 1;
  EXPECT_EQ(ParseRequest(flags, kKey, &out), WireError::kBadReserved);
  auto reserved = good;
  reserved[13] = 1;
  EXPECT_EQ(ParseRequest(reserved, kKey, &out), WireError::kBadReserved);
  auto mac = good;
  mac[63] ^= 0x80;
  EXPECT_EQ(ParseRequest(mac, kKey, &out), WireError::kBadMac);
}

TEST(TransportWire, UnknownRequestVersionStillYieldsItsNonce) {
  auto future = EncodeRequest(SampleRequest(), kKey);
  future[4] = 2;
  Request out;
  EXPECT_EQ(ParseRequest(future, kKey, &out), WireError::kBadVersion);
  // A future version may be longer; its preamble is still readable.
  std::vector<uint8_t> longer(future.begin(), future.end());
  longer.resize(200, 0xee);
  EXPECT_EQ(ParseRequest(longer, kKey, &out), WireError::kBadVersion);
  RequestPreamble preamble;
  ASSERT_EQ(ParseRequestPreamble(longer, &preamble), WireError::kOk);
  EXPECT_EQ(preamble.version, 2);
  EXPECT_EQ(preamble.exporter_pid, 4321u);
  EXPECT_EQ(preamble.nonce, SampleNonce());
  EXPECT_EQ(ParseRequestPreamble(std::span<const uint8_t>(longer.data(), 31), &preamble),
            WireError::kTooShort);
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

TEST(TransportWire, KeysDifferByTokenAndPid) {
  const SipKey a = DeriveKey(1, 2);
  const SipKey b = DeriveKey(1, 3);
  const SipKey c = DeriveKey(2, 2);
  EXPECT_FALSE(a.k0 == b.k0 && a.k1 == b.k1);
  EXPECT_FALSE(a.k0 == c.k0 && a.k1 == c.k1);
}

}  // namespace
}  // namespace vmmipc::transport::wire
