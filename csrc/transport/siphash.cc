// SipHash-2-4 from the specification in "SipHash: a fast short-input PRF"
// (Aumasson, Bernstein; INDOCRYPT 2012): 2 compression rounds per 8-byte word,
// 4 finalization rounds, 64-bit output. Byte order is little-endian throughout.
#include "transport/siphash.h"

#include <bit>

#include "common/little_endian.h"

namespace vmmipc::transport {
namespace {

uint64_t Load64(const uint8_t* p) { return LoadLE<uint64_t>(p); }

inline void SipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = std::rotl(v1, 13);
  v1 ^= v0;
  v0 = std::rotl(v0, 32);
  v2 += v3;
  v3 = std::rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = std::rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = std::rotl(v1, 17);
  v1 ^= v2;
  v2 = std::rotl(v2, 32);
}

}  // namespace

SipHasher::SipHasher(const SipKey& key)
    // The initialization constants are "somepseudorandomlygeneratedbytes".
    : v0_(key.k0 ^ 0x736f6d6570736575ULL),
      v1_(key.k1 ^ 0x646f72616e646f6dULL),
      v2_(key.k0 ^ 0x6c7967656e657261ULL),
      v3_(key.k1 ^ 0x7465646279746573ULL) {}

void SipHasher::Compress(uint64_t m) {
  v3_ ^= m;
  SipRound(v0_, v1_, v2_, v3_);
  SipRound(v0_, v1_, v2_, v3_);
  v0_ ^= m;
}

void SipHasher::Update(std::span<const uint8_t> bytes) {
  total_len_ += bytes.size();
  size_t i = 0;
  if (tail_len_ > 0) {
    while (tail_len_ < 8 && i < bytes.size()) tail_[tail_len_++] = bytes[i++];
    if (tail_len_ < 8) return;
    Compress(Load64(tail_));
    tail_len_ = 0;
  }
  for (; i + 8 <= bytes.size(); i += 8) Compress(Load64(bytes.data() + i));
  while (i < bytes.size()) tail_[tail_len_++] = bytes[i++];
}

uint64_t SipHasher::Final() {
  // Last word: the remaining bytes, zero padded, with the length mod 256 in
  // the most significant byte.
  uint64_t b = (total_len_ & 0xff) << 56;
  for (size_t i = 0; i < tail_len_; ++i) b |= static_cast<uint64_t>(tail_[i]) << (8 * i);
  Compress(b);
  v2_ ^= 0xff;
  for (int i = 0; i < 4; ++i) SipRound(v0_, v1_, v2_, v3_);
  return v0_ ^ v1_ ^ v2_ ^ v3_;
}

uint64_t SipHash24(const SipKey& key, std::span<const uint8_t> bytes) {
  SipHasher hasher(key);
  hasher.Update(bytes);
  return hasher.Final();
}

}  // namespace vmmipc::transport
