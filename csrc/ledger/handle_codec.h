// The VMM2 handle: the 64 bytes that cuIpcGetMemHandle returns for VMM memory.
// Layout, byte order and the version rule are documented in docs/blob-format.md;
// this file is their only implementation. Pure data: no driver, no sockets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmipc::ledger {

inline constexpr size_t kHandleSize = 64;
inline constexpr uint32_t kHandleMagic = 0x324D4D56u;  // bytes "VMM2" little-endian
// Version 3 (what this build writes) has version 2's layout; the instance
// names the exporter's socket instead of the pid. Version 2 handles, of an
// older vmmipc, are still read (their exporters listen under their pid).
inline constexpr uint8_t kHandleVersion = 3;
inline constexpr uint8_t kOldestHandleVersion = 2;
inline constexpr uint16_t kUnranked = 0xFFFF;

struct Vmm2Handle {
  uint8_t version = kHandleVersion;
  uint8_t flags = 0;  // reserved for future use; versions 2 and 3 write 0
  uint16_t rank_slot = kUnranked;
  uint32_t pid = 0;          // exporter pid, as the exporter sees it (names a version 2 socket)
  uint32_t generation = 0;   // identity of the physical chunk holding `address`
  uint64_t capability = 0;   // the exporter's MAC over every other field (never 0)
  uint64_t address = 0;      // the exporter address given to cuIpcGetMemHandle
  uint64_t chunk_size = 0;   // size of the chunk (one mapping) holding `address`
  uint64_t chunk_base = 0;   // base of that chunk in the exporter
  uint64_t region_base = 0;  // base of the exporter's region (reservation or arena)
  uint32_t instance = 0;     // the exporter process's public random id (never 0; names its socket)

  bool operator==(const Vmm2Handle&) const = default;
};

enum class DecodeStatus {
  kOk,
  kNotVmm2,         // no VMM2 magic: a legacy handle or garbage; belongs to the real driver
  kBadChecksum,     // magic present but the CRC does not match: corrupted
  kUnknownVersion,  // a version this build does not know (newer vmmipc on the other side)
  kMalformed,       // fields contradict each other (address outside its chunk, instance 0, ...)
};
const char* DecodeStatusName(DecodeStatus status);

void EncodeHandle(const Vmm2Handle& handle, unsigned char out[kHandleSize]);
DecodeStatus DecodeHandle(const unsigned char in[kHandleSize], Vmm2Handle* handle);
// The version a handle claims (its byte at the place every version keeps),
// for the log line of DecodeStatus::kUnknownVersion.
uint8_t HandleVersion(const unsigned char in[kHandleSize]);

}  // namespace vmmipc::ledger
