// Fuzz target: the importer's parsing of one reply message (transport/wire.h,
// ParseReply): what a possibly hostile exporter, or a squatter, sends back.
// Input: one mode byte (bit 0: recompute the MAC for the client's nonce and
// key, so that the layout checks behind the MAC are reached), then the
// message (at most kMaxReplySize + 64 bytes).
// Invariants: no crash; a reply that parses has a consistent header
// (refusal: no entries, batch 0 of 1; grant: total within kMaxTotalChunks,
// the batch's entry count as the batching rule says), non-empty entries that
// do not wrap, re-encodes to exactly the same bytes, and fails under any
// other nonce (a recorded reply is worthless).
#include <cstring>

#include "fuzz_util.h"

namespace vmmipc::fuzz {
namespace {

using namespace transport;

const SipKey kKey = wire::DeriveKey(0x5eed5eed12345678ull, 4242);

wire::Nonce MakeNonce(uint8_t first) {
  wire::Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(first + i);
  return n;
}
const wire::Nonce kNonce = MakeNonce(0xa0);
const wire::Nonce kOtherNonce = MakeNonce(0xb0);

void CheckOne(const std::vector<uint8_t>& message) {
  wire::ReplyHeader header;
  std::vector<wire::ReplyEntry> entries;
  const wire::WireError e = wire::ParseReply(message, kNonce, kKey, &header, &entries);
  FUZZ_CHECK(wire::WireErrorName(e) != nullptr);
  if (e != wire::WireError::kOk) {
    FUZZ_CHECK(entries.empty());
    return;
  }
  FUZZ_CHECK(header.version == wire::kVersion);
  FUZZ_CHECK(entries.size() == header.entry_count);
  FUZZ_CHECK(entries.size() <= wire::kMaxChunksPerBatch);
  FUZZ_CHECK(message.size() == wire::kReplyHeaderSize + entries.size() * wire::kReplyEntrySize);
  if (header.status != 0) {
    FUZZ_CHECK(entries.empty() && header.total_chunks == 0 && header.batch_index == 0 &&
               header.batch_count == 1);
  } else {
    FUZZ_CHECK(header.total_chunks >= 1 && header.total_chunks <= wire::kMaxTotalChunks);
    FUZZ_CHECK(header.batch_count == wire::BatchCount(header.total_chunks));
    FUZZ_CHECK(header.batch_index < header.batch_count);
    // Every batch but the last is full; the batches add up to the total.
    const uint64_t before = uint64_t{header.batch_index} * wire::kMaxChunksPerBatch;
    FUZZ_CHECK(before + entries.size() <= header.total_chunks);
    if (header.batch_index + 1 < header.batch_count)
      FUZZ_CHECK(entries.size() == wire::kMaxChunksPerBatch);
    else
      FUZZ_CHECK(before + entries.size() == header.total_chunks);
  }
  for (const auto& entry : entries)
    FUZZ_CHECK(entry.size != 0 && entry.address + entry.size > entry.address);
  const std::vector<uint8_t> again = wire::EncodeReply(kNonce, kKey, header, entries);
  FUZZ_CHECK(again == message);
  wire::ReplyHeader other_header;
  std::vector<wire::ReplyEntry> other_entries;
  FUZZ_CHECK(wire::ParseReply(message, kOtherNonce, kKey, &other_header, &other_entries) ==
             wire::WireError::kBadMac);
}

void WriteSeeds() {
  auto seed = [](const char* name, uint8_t mode, std::span<const uint8_t> bytes) {
    Writer w;
    w.U8(mode);
    w.Append(bytes);
    WriteSeed(name, w.bytes);
  };
  wire::ReplyHeader refusal;
  refusal.status = 1;
  refusal.batch_count = 1;
  seed("refusal_bad_token", 0, wire::EncodeReply(kNonce, kKey, refusal, {}));
  std::vector<wire::ReplyEntry> entries;
  for (uint64_t i = 0; i < 3; ++i)
    entries.push_back({0x7f0000200000ull + i * 0x200000, 0x200000, static_cast<uint32_t>(i + 1)});
  wire::ReplyHeader grant;
  grant.total_chunks = 3;
  grant.batch_count = 1;
  seed("grant_3", 0, wire::EncodeReply(kNonce, kKey, grant, entries));
  std::vector<wire::ReplyEntry> full;
  for (uint64_t i = 0; i < wire::kMaxChunksPerBatch; ++i)
    full.push_back({0x100000000ull + i * 0x1000, 0x1000, 9});
  wire::ReplyHeader first;
  first.total_chunks = 300;
  first.batch_count = 2;
  seed("grant_300_batch_0", 0, wire::EncodeReply(kNonce, kKey, first, full));
  wire::ReplyHeader last = first;
  last.batch_index = 1;
  full.resize(300 - wire::kMaxChunksPerBatch);
  seed("grant_300_batch_1", 0, wire::EncodeReply(kNonce, kKey, last, full));
  seed("grant_3_other_nonce", 0, wire::EncodeReply(kOtherNonce, kKey, grant, entries));
}

}  // namespace
}  // namespace vmmipc::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  vmmipc::fuzz::WriteSeedsIfAsked(vmmipc::fuzz::WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vmmipc::fuzz::Reader in(data, size);
  const uint8_t mode = in.U8();
  std::vector<uint8_t> message = in.Bytes(vmmipc::transport::wire::kMaxReplySize + 64);
  if (mode & 1) vmmipc::fuzz::FixReplyMac(message, vmmipc::fuzz::kNonce, vmmipc::fuzz::kKey);
  vmmipc::fuzz::CheckOne(message);
  return 0;
}
