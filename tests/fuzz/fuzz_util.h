// Shared helpers of the libFuzzer targets: a byte reader over the fuzz input,
// MAC fixers (so that mutated records still reach the checks behind the MAC),
// fd counting for the no-leak invariants, and seed writing (FUZZ_WRITE_SEEDS).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "transport/siphash.h"
#include "transport/wire.h"

namespace vmmipc::fuzz {

// Aborts with a message: an invariant of the code under test does not hold.
#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

// Reads the fuzz input front to back; past the end it yields zeros.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return U16() | (static_cast<uint32_t>(U16()) << 16); }
  uint64_t U64() { return U32() | (static_cast<uint64_t>(U32()) << 32); }
  // Up to `n` bytes (fewer when the input runs out).
  std::vector<uint8_t> Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::vector<uint8_t> out(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return out;
  }
  std::vector<uint8_t> Rest() { return Bytes(size_ - pos_); }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends little-endian integers when building seeds.
class Writer {
 public:
  void U8(uint8_t v) { bytes.push_back(v); }
  void U16(uint16_t v) { U8(v & 0xff), U8(v >> 8); }
  void U32(uint32_t v) { U16(v & 0xffff), U16(v >> 16); }
  void U64(uint64_t v) { U32(static_cast<uint32_t>(v)), U32(static_cast<uint32_t>(v >> 32)); }
  void Append(std::span<const uint8_t> b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
  std::vector<uint8_t> bytes;
};

inline int CountFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// Logs cost more than the code under test and say nothing to the fuzzer:
// off, unless FUZZ_LOG is set.
inline void QuietLogs() {
  if (std::getenv("FUZZ_LOG") == nullptr) log::SetLevel(log::Level::kOff);
}

// Overwrites a request's MAC (bytes 72..80) with the one the exporter with
// `secret` expects for the handle the request names: SipHash(KeyFor(secret,
// fields), "req\0" || request[0..72)), docs/protocol.md. Requests too short or
// of another version are left as they are.
inline void FixRequestMac(std::span<uint8_t> message, const transport::SipKey& secret) {
  transport::wire::Request claimed;
  if (!transport::wire::PeekRequestFields(message, &claimed)) return;
  const transport::SipKey key = transport::wire::KeyFor(secret, claimed.handle);
  static constexpr uint8_t kTag[4] = {'r', 'e', 'q', 0};
  constexpr size_t kMacAt = transport::wire::kRequestSize - 8;
  transport::SipHasher h(key);
  h.Update(kTag);
  h.Update(message.first(kMacAt));
  const uint64_t mac = h.Final();
  for (size_t i = 0; i < 8; ++i) message[kMacAt + i] = static_cast<uint8_t>(mac >> (8 * i));
}

// Overwrites a reply message's MAC (bytes 24..32): SipHash(key, "rep\0" ||
// nonce || header[0..24) || entries).
inline void FixReplyMac(std::span<uint8_t> message, const transport::wire::Nonce& nonce,
                        const transport::SipKey& key) {
  if (message.size() < transport::wire::kReplyHeaderSize) return;
  static constexpr uint8_t kTag[4] = {'r', 'e', 'p', 0};
  transport::SipHasher h(key);
  h.Update(kTag);
  h.Update(nonce);
  h.Update(message.first(24));
  h.Update(message.subspan(32));
  const uint64_t mac = h.Final();
  for (int i = 0; i < 8; ++i) message[24 + i] = static_cast<uint8_t>(mac >> (8 * i));
}

// FUZZ_WRITE_SEEDS=<dir>: the target writes its seed corpus there and exits
// (how tests/fuzz/corpus/<target>/ was made; see tests/fuzz/run.sh).
inline const char* SeedDir() { return std::getenv("FUZZ_WRITE_SEEDS"); }

// For LLVMFuzzerInitialize: with FUZZ_WRITE_SEEDS set, writes the target's
// seed corpus there and exits instead of fuzzing.
inline void WriteSeedsIfAsked(void (*write_seeds)()) {
  if (SeedDir() == nullptr) return;
  write_seeds();
  std::exit(0);
}

inline void WriteSeed(const std::string& name, std::span<const uint8_t> bytes) {
  const std::string path = std::string(SeedDir()) + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace vmmipc::fuzz
