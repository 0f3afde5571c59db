// CRC-32C: the SSE4.2 crc32 instruction where the CPU has it (every x86-64
// server of the last decade: 8 bytes per instruction, so that a get, which
// checksums 60 bytes, does not pay ~2 ns per byte of table lookups), else
// the standard 256-entry table built at compile time. Both give the same
// value (tests/unit/handle_codec_test.cc compares them).
#include "common/crc32c.h"

#include <array>

#include "common/little_endian.h"

namespace vmmipc {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const unsigned char* bytes, size_t size) {
  uint64_t crc = 0xFFFFFFFFu;
  for (; size >= 8; bytes += 8, size -= 8) {
    // Little-endian, as the reflected CRC reads it (one move on x86-64).
    crc = __builtin_ia32_crc32di(crc, LoadLE<uint64_t>(bytes));
  }
  auto narrow = static_cast<uint32_t>(crc);
  for (; size > 0; ++bytes, --size) narrow = __builtin_ia32_crc32qi(narrow, *bytes);
  return narrow ^ 0xFFFFFFFFu;
}

bool HasSse42() {
  // Evaluated on the first checksum, never at load time.
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t Crc32c(const void* data, size_t size) {
#if defined(__x86_64__)
  if (HasSse42()) return Crc32cSse42(static_cast<const unsigned char*>(data), size);
#endif
  return Crc32cPortable(data, size);
}

}  // namespace vmmipc
