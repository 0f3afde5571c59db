// Encoding and decoding of VMM2 handles: explicit little-endian byte layout,
// every byte defined, CRC-32C over bytes 0..59 stored at 60..63.
#include "ledger/handle_codec.h"

#include <cstring>

#include "common/crc32c.h"
#include "common/little_endian.h"

namespace vmmipc::ledger {
namespace {

// Offsets of docs/blob-format.md (versions 2 and 3). Magic, version and the CRC's
// place are fixed for every version; the rest may change with the version.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffFlags = 5, kOffRank = 6, kOffPid = 8,
                 kOffGeneration = 12, kOffCapability = 16, kOffAddress = 24, kOffChunkSize = 32,
                 kOffChunkBase = 40, kOffRegionBase = 48, kOffInstance = 56, kOffCrc = 60;

template <typename T>
void Put(unsigned char* out, size_t offset, T value) {
  StoreLE<T>(out + offset, value);
}

template <typename T>
T Get(const unsigned char* in, size_t offset) {
  return LoadLE<T>(in + offset);
}

}  // namespace

const char* DecodeStatusName(DecodeStatus status) {
  switch (status) {
    case DecodeStatus::kOk:
      return "ok";
    case DecodeStatus::kNotVmm2:
      return "not a VMM2 handle";
    case DecodeStatus::kBadChecksum:
      return "VMM2 handle with a bad checksum (corrupted)";
    case DecodeStatus::kUnknownVersion:
      return "VMM2 handle of an unknown version";
    case DecodeStatus::kMalformed:
      return "malformed VMM2 handle";
  }
  return "?";
}

void EncodeHandle(const Vmm2Handle& h, unsigned char out[kHandleSize]) {
  std::memset(out, 0, kHandleSize);
  Put<uint32_t>(out, kOffMagic, kHandleMagic);
  Put<uint8_t>(out, kOffVersion, h.version);
  Put<uint8_t>(out, kOffFlags, h.flags);
  Put<uint16_t>(out, kOffRank, h.rank_slot);
  Put<uint32_t>(out, kOffPid, h.pid);
  Put<uint32_t>(out, kOffGeneration, h.generation);
  Put<uint64_t>(out, kOffCapability, h.capability);
  Put<uint64_t>(out, kOffAddress, h.address);
  Put<uint64_t>(out, kOffChunkSize, h.chunk_size);
  Put<uint64_t>(out, kOffChunkBase, h.chunk_base);
  Put<uint64_t>(out, kOffRegionBase, h.region_base);
  Put<uint32_t>(out, kOffInstance, h.instance);
  Put<uint32_t>(out, kOffCrc, Crc32c(out, kOffCrc));
}

DecodeStatus DecodeHandle(const unsigned char in[kHandleSize], Vmm2Handle* h) {
  if (Get<uint32_t>(in, kOffMagic) != kHandleMagic) return DecodeStatus::kNotVmm2;
  if (Get<uint32_t>(in, kOffCrc) != Crc32c(in, kOffCrc)) return DecodeStatus::kBadChecksum;
  const uint8_t version = Get<uint8_t>(in, kOffVersion);
  if (version < kOldestHandleVersion || version > kHandleVersion)
    return DecodeStatus::kUnknownVersion;
  Vmm2Handle out;
  out.version = Get<uint8_t>(in, kOffVersion);
  out.flags = Get<uint8_t>(in, kOffFlags);
  out.rank_slot = Get<uint16_t>(in, kOffRank);
  out.pid = Get<uint32_t>(in, kOffPid);
  out.generation = Get<uint32_t>(in, kOffGeneration);
  out.capability = Get<uint64_t>(in, kOffCapability);
  out.address = Get<uint64_t>(in, kOffAddress);
  out.chunk_size = Get<uint64_t>(in, kOffChunkSize);
  out.chunk_base = Get<uint64_t>(in, kOffChunkBase);
  out.region_base = Get<uint64_t>(in, kOffRegionBase);
  out.instance = Get<uint32_t>(in, kOffInstance);
  const bool address_in_chunk = out.address >= out.chunk_base && out.chunk_size != 0 &&
                                out.address - out.chunk_base < out.chunk_size;
  if (out.capability == 0 || out.instance == 0 || out.pid == 0 || !address_in_chunk ||
      out.region_base > out.chunk_base || out.flags != 0)
    return DecodeStatus::kMalformed;
  *h = out;
  return DecodeStatus::kOk;
}

uint8_t HandleVersion(const unsigned char in[kHandleSize]) { return Get<uint8_t>(in, kOffVersion); }

}  // namespace vmmipc::ledger
