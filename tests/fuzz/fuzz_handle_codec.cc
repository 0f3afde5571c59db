// Fuzz target: the VMM2 handle decoder (ledger/handle_codec), the first code
// that touches the 64 bytes a peer hands to cuIpcOpenMemHandle.
// Input: one mode byte (bit 0: recompute the CRC so that the field checks
// behind it are reached), then the handle's bytes (zero-padded to 64).
// Invariants: decoding never crashes or reads past 64 bytes; the status
// follows docs/blob-format.md's order; a handle that decodes re-encodes to
// exactly the same 64 bytes and satisfies every field rule.
#include <cstring>

#include "common/crc32c.h"
#include "fuzz_util.h"
#include "ledger/handle_codec.h"

namespace vmmipc::fuzz {
namespace {

using ledger::DecodeStatus;
using ledger::kHandleSize;

uint32_t Le32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

void CheckOne(const unsigned char bytes[kHandleSize]) {
  // A heap copy of exactly 64 bytes: ASan catches any read past the handle.
  std::vector<unsigned char> exact(bytes, bytes + kHandleSize);
  ledger::Vmm2Handle h;
  h.pid = 0xdeadbeef;  // must stay untouched unless kOk
  const DecodeStatus status = ledger::DecodeHandle(exact.data(), &h);
  FUZZ_CHECK(ledger::DecodeStatusName(status) != nullptr);

  const bool magic = Le32(bytes) == ledger::kHandleMagic;
  const bool crc = Le32(bytes + 60) == Crc32c(bytes, 60);
  if (!magic) {
    FUZZ_CHECK(status == DecodeStatus::kNotVmm2);
  } else if (!crc) {
    FUZZ_CHECK(status == DecodeStatus::kBadChecksum);
  } else if (bytes[4] < ledger::kOldestHandleVersion || bytes[4] > ledger::kHandleVersion) {
    FUZZ_CHECK(status == DecodeStatus::kUnknownVersion);
  } else {
    FUZZ_CHECK(status == DecodeStatus::kOk || status == DecodeStatus::kMalformed);
  }
  if (status != DecodeStatus::kOk) {
    FUZZ_CHECK(h.pid == 0xdeadbeef);
    return;
  }
  // Every rule of a valid handle.
  FUZZ_CHECK(h.version >= ledger::kOldestHandleVersion && h.version <= ledger::kHandleVersion &&
             h.flags == 0);
  FUZZ_CHECK(h.capability != 0 && h.instance != 0 && h.pid != 0);
  FUZZ_CHECK(h.chunk_size != 0 && h.address >= h.chunk_base &&
             h.address - h.chunk_base < h.chunk_size);
  FUZZ_CHECK(h.region_base <= h.chunk_base);
  // Round trip, byte for byte: every byte of a valid handle is defined.
  unsigned char again[kHandleSize];
  ledger::EncodeHandle(h, again);
  FUZZ_CHECK(std::memcmp(again, bytes, kHandleSize) == 0);
  ledger::Vmm2Handle twice;
  FUZZ_CHECK(ledger::DecodeHandle(again, &twice) == DecodeStatus::kOk && twice == h);
}

void WriteSeeds() {
  ledger::Vmm2Handle h;
  h.rank_slot = 1;
  h.pid = 4242;
  h.generation = 7;
  h.capability = 0x1122334455667788ull;
  h.instance = 0xA1B2C3D4u;
  h.chunk_base = 0x7f0000200000ull;
  h.chunk_size = 0x200000;
  h.address = h.chunk_base + 0x1000;
  h.region_base = 0x7f0000000000ull;
  auto seed = [](const char* name, uint8_t mode, const ledger::Vmm2Handle& handle) {
    Writer w;
    w.U8(mode);
    unsigned char bytes[kHandleSize];
    ledger::EncodeHandle(handle, bytes);
    w.Append(std::span<const uint8_t>(bytes, kHandleSize));
    WriteSeed(name, w.bytes);
  };
  seed("valid_ranked", 0, h);
  ledger::Vmm2Handle unranked = h;
  unranked.rank_slot = ledger::kUnranked;
  seed("valid_unranked", 0, unranked);
  ledger::Vmm2Handle future = h;
  future.version = ledger::kHandleVersion + 1;
  seed("future_version", 0, future);
  ledger::Vmm2Handle outside = h;
  outside.address = h.chunk_base + h.chunk_size;  // just past its chunk
  seed("address_outside_chunk_fix_crc", 1, outside);
  ledger::Vmm2Handle wrap = h;
  wrap.chunk_base = ~0ull - 0xfff;
  wrap.address = wrap.chunk_base + 0x10;
  wrap.chunk_size = 0x10000;  // chunk wraps around the address space
  seed("chunk_wraps_fix_crc", 1, wrap);
  // A legacy handle of the simulated driver starts "SIMLEG01": not VMM2.
  Writer legacy;
  legacy.U8(0);
  const char kLegacy[] = "SIMLEG01";
  legacy.Append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(kLegacy), 8));
  for (int i = 8; i < 64; ++i) legacy.U8(static_cast<uint8_t>(i));
  WriteSeed("legacy_sim_handle", legacy.bytes);
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
  unsigned char bytes[vmmipc::ledger::kHandleSize] = {};
  const std::vector<uint8_t> body = in.Bytes(vmmipc::ledger::kHandleSize);
  if (!body.empty()) std::memcpy(bytes, body.data(), body.size());
  if (mode & 1) {
    const uint32_t crc = vmmipc::Crc32c(bytes, 60);
    for (int i = 0; i < 4; ++i) bytes[60 + i] = static_cast<unsigned char>(crc >> (8 * i));
  }
  vmmipc::fuzz::CheckOne(bytes);
  return 0;
}
