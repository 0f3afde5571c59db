// SipHash-2-4 (Aumasson & Bernstein, 2012): the keyed 64-bit PRF that MACs
// every protocol record. Written from the paper's specification; owns only the
// hash, not what is hashed (wire.cc decides that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace vmmipc::transport {

struct SipKey {
  uint64_t k0 = 0;  // the key's first 8 bytes, little-endian
  uint64_t k1 = 0;  // the key's last 8 bytes, little-endian
};

// Streaming form, so that a MAC over several fields needs no copy into one
// buffer. Update() may be called any number of times with any split.
class SipHasher {
 public:
  explicit SipHasher(const SipKey& key);
  void Update(std::span<const uint8_t> bytes);
  // Finishes the hash. The hasher must not be used afterwards.
  uint64_t Final();

 private:
  void Compress(uint64_t m);

  uint64_t v0_, v1_, v2_, v3_;
  uint8_t tail_[8] = {};  // bytes not yet forming a full 8-byte word
  size_t tail_len_ = 0;
  uint64_t total_len_ = 0;  // only its low byte enters the hash (the spec's b)
};

uint64_t SipHash24(const SipKey& key, std::span<const uint8_t> bytes);

}  // namespace vmmipc::transport
