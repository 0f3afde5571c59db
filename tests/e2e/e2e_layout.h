// What the end-to-end suites share about the address layout their peers use
// and the peers' number format. The layout comes from the environment when a
// suite runs with another one (ThreadSanitizer builds, whose shadow memory
// owns the default addresses), else it is the library's defaults.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vmmipc::testing {

inline constexpr uint64_t kChunk = 2ull << 20;

inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::stoull(value, nullptr, 0) : fallback;
}
inline const uint64_t kZoneBase = EnvOr("VMMIPC_ZONE_BASE", 0x300000000000ull);
inline const uint64_t kSlotSize = EnvOr("VMMIPC_SLOT_SIZE", 1ull << 40);
inline const uint64_t kSlots = EnvOr("VMMIPC_ZONE_SLOTS", 8);
// The tests' own fallback base: the default (0x600000000000) is where
// AddressSanitizer keeps its heap, so sanitizer builds could not use it.
inline const uint64_t kFallbackBase = EnvOr("E2E_FALLBACK_BASE", 0x400000000000ull);

// Peers answer in hex ("ok 0x7f..."); these convert both ways.
inline std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
inline uint64_t Num(const std::string& s) { return s.empty() ? 0 : std::stoull(s, nullptr, 0); }

}  // namespace vmmipc::testing
