// Little-endian loads and stores: every byte layout of vmmipc (the VMM2
// handle, the protocol records, SipHash's words) is little-endian, written and
// read byte by byte so that it does not depend on the host's byte order or
// alignment (compilers turn these loops into single moves on x86-64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace vmmipc {

template <typename T>
void StoreLE(uint8_t* out, T value) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

template <typename T>
T LoadLE(const uint8_t* in) {
  static_assert(std::is_unsigned_v<T>);
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<T>(in[i]) << (8 * i));
  return value;
}

}  // namespace vmmipc
