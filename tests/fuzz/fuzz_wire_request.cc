// Fuzz target: the exporter's parsing of a request (transport/wire.h,
// ParseRequestPreamble + ParseRequest), i.e. the first bytes an untrusted
// peer gets to put in front of the listener.
// Input: one mode byte (bit 0: recompute the MAC under the listener's key, so
// the checks behind the MAC are reached), then the message (at most 512
// bytes, the listener's receive buffer).
// Invariants: no crash; ParseRequest fails whenever the preamble does, with
// the same error; a request that parses is exactly 64 bytes and re-encodes
// to the same bytes; a request that parses under one key fails under another.
#include <cstring>

#include "fuzz_util.h"

namespace vmmipc::fuzz {
namespace {

using namespace transport;

const SipKey kSecret{0x5eed5eed12345678ull, 0x0123456789abcdefull};
const SipKey kOtherSecret{0x5eed5eed12345678ull, 0x0123456789abcdeeull};  // another process

void CheckOne(const std::vector<uint8_t>& message) {
  wire::RequestPreamble preamble;
  const wire::WireError pe = wire::ParseRequestPreamble(message, &preamble);
  wire::Request request;
  request.handle.exporter_pid = 0xdeadbeef;
  const wire::WireError e = wire::ParseRequest(message, kSecret, &request);
  FUZZ_CHECK(wire::WireErrorName(e) != nullptr);
  if (pe != wire::WireError::kOk) {
    FUZZ_CHECK(e == pe);
    FUZZ_CHECK(message.size() < wire::kRequestPreambleSize ||
               !(message[0] == 'V' && message[1] == 'M' && message[2] == 'R' && message[3] == 'Q'));
    return;
  }
  FUZZ_CHECK(message.size() >= wire::kRequestPreambleSize);
  FUZZ_CHECK(std::memcmp(preamble.nonce.data(), message.data() + 16, 16) == 0);
  if (e != wire::WireError::kOk) {
    FUZZ_CHECK(request.handle.exporter_pid == 0xdeadbeef);  // untouched on failure
    return;
  }
  FUZZ_CHECK(message.size() == wire::kRequestSize);
  FUZZ_CHECK(preamble.version == wire::kVersion);
  FUZZ_CHECK(request.handle.exporter_pid == preamble.exporter_pid &&
             request.nonce == preamble.nonce);
  const auto again = wire::EncodeRequest(request, wire::KeyFor(kSecret, request.handle));
  FUZZ_CHECK(std::memcmp(again.data(), message.data(), wire::kRequestSize) == 0);
  wire::Request other;
  FUZZ_CHECK(wire::ParseRequest(message, kOtherSecret, &other) == wire::WireError::kBadMac);
  // Any field edited, with the MAC kept, names another handle: refused.
  std::vector<uint8_t> edited = message;
  edited[32 + (message[16] % 40)] ^= 1;  // a byte of the fields (32..72), picked by the nonce
  FUZZ_CHECK(wire::ParseRequest(edited, kSecret, &other) != wire::WireError::kOk);
}

void WriteSeeds() {
  wire::Request r;
  r.handle.exporter_pid = 4242;
  for (size_t i = 0; i < r.nonce.size(); ++i) r.nonce[i] = static_cast<uint8_t>(0xa0 + i);
  r.handle.address = 0x7f0000201000ull;
  r.handle.chunk_base = 0x7f0000200000ull;
  r.handle.chunk_size = 0x200000;
  r.handle.region_base = 0x7f0000000000ull;
  r.handle.generation = 3;
  r.handle.rank_slot = 2;
  const auto valid = wire::EncodeRequest(r, wire::KeyFor(kSecret, r.handle));
  auto seed = [](const char* name, uint8_t mode, std::span<const uint8_t> bytes) {
    Writer w;
    w.U8(mode);
    w.Append(bytes);
    WriteSeed(name, w.bytes);
  };
  seed("valid", 0, valid);
  seed("valid_fix_mac", 1, valid);
  auto future = valid;
  future[4] = 3;  // version 3, longer
  std::vector<uint8_t> longer(future.begin(), future.end());
  longer.resize(112, 0x55);
  seed("future_version_longer", 1, longer);
  auto flags = valid;
  flags[6] = 1;
  seed("nonzero_flags_fix_mac", 1, flags);
  seed("preamble_only", 0, std::span<const uint8_t>(valid.data(), 32));
  seed("other_secret", 0, wire::EncodeRequest(r, wire::KeyFor(kOtherSecret, r.handle)));
  auto old = valid;
  old[4] = 1;  // version 1, as 64 bytes
  seed("version_1", 0, std::span<const uint8_t>(old.data(), 64));
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
  std::vector<uint8_t> message = in.Bytes(512);
  if (mode & 1) vmmipc::fuzz::FixRequestMac(message, vmmipc::fuzz::kSecret);
  vmmipc::fuzz::CheckOne(message);
  return 0;
}
