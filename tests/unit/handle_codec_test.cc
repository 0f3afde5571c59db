// The VMM2 handle: round trip, every byte defined, and every way a handle can
// be wrong (legacy bytes, corruption, unknown version, contradicting fields).
#include "ledger/handle_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/crc32c.h"

namespace vmmipc::ledger {
namespace {

Vmm2Handle Sample() {
  Vmm2Handle h;
  h.rank_slot = 3;
  h.pid = 4242;
  h.generation = 77;
  h.capability = 0x1122334455667788ull;
  h.instance = 0xA1B2C3D4u;
  h.chunk_base = 0x7f0000200000ull;
  h.chunk_size = 2 << 20;
  h.address = h.chunk_base + 4096;
  h.region_base = 0x7f0000000000ull;
  return h;
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
}

TEST(Crc32c, HardwareAndTableAgreeOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  unsigned char buffer[80];
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 8; ++offset)
    for (size_t size = 0; size + offset <= sizeof(buffer); ++size)
      ASSERT_EQ(Crc32c(buffer + offset, size), Crc32cPortable(buffer + offset, size))
          << "offset " << offset << " size " << size;
}

TEST(HandleCodec, RoundTripsEveryField) {
  unsigned char bytes[kHandleSize];
  EncodeHandle(Sample(), bytes);
  Vmm2Handle out;
  ASSERT_EQ(DecodeHandle(bytes, &out), DecodeStatus::kOk);
  EXPECT_EQ(out, Sample());
}

TEST(HandleCodec, LayoutIsLittleEndianAndStable) {
  unsigned char bytes[kHandleSize];
  EncodeHandle(Sample(), bytes);
  EXPECT_EQ(std::memcmp(bytes, "VMM2", 4), 0);
  EXPECT_EQ(bytes[4], 3);  // version
  EXPECT_EQ(bytes[6], 3);  // rank slot, low byte first
  EXPECT_EQ(bytes[8] | bytes[9] << 8, 4242);
  EXPECT_EQ(bytes[16], 0x88);  // capability, low byte first
  EXPECT_EQ(bytes[56], 0xD4);  // instance, low byte first
  EXPECT_EQ(bytes[59], 0xA1);
}

TEST(HandleCodec, EveryByteIsDefinedWhateverTheBufferHeld) {
  unsigned char a[kHandleSize], b[kHandleSize];
  std::memset(a, 0xAA, sizeof(a));
  std::memset(b, 0x55, sizeof(b));
  EncodeHandle(Sample(), a);
  EncodeHandle(Sample(), b);
  EXPECT_EQ(std::memcmp(a, b, kHandleSize), 0);
}

TEST(HandleCodec, ForeignBytesAreNotVmm2) {
  unsigned char bytes[kHandleSize] = {};
  Vmm2Handle out;
  EXPECT_EQ(DecodeHandle(bytes, &out), DecodeStatus::kNotVmm2);
  std::mt19937 rng(1);
  int accepted = 0;
  for (int i = 0; i < 10000; ++i) {
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    if (DecodeHandle(bytes, &out) == DecodeStatus::kOk) ++accepted;
  }
  EXPECT_EQ(accepted, 0);
}

TEST(HandleCodec, AnySingleBitFlipIsDetected) {
  unsigned char good[kHandleSize];
  EncodeHandle(Sample(), good);
  for (size_t bit = 32; bit < kHandleSize * 8; ++bit) {  // past the magic
    unsigned char bad[kHandleSize];
    std::memcpy(bad, good, kHandleSize);
    bad[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    Vmm2Handle out;
    EXPECT_EQ(DecodeHandle(bad, &out), DecodeStatus::kBadChecksum) << "bit " << bit;
  }
}

// Version 2 (an older vmmipc: the pid names its socket) is read as it was;
// this build writes 3 (the instance names it).
TEST(HandleCodec, VersionTwoIsStillReadAndThreeIsWritten) {
  EXPECT_EQ(Vmm2Handle().version, 3);
  for (uint8_t version : {2, 3}) {
    Vmm2Handle h = Sample();
    h.version = version;
    unsigned char bytes[kHandleSize];
    EncodeHandle(h, bytes);
    EXPECT_EQ(bytes[4], version);
    Vmm2Handle out;
    ASSERT_EQ(DecodeHandle(bytes, &out), DecodeStatus::kOk) << int(version);
    EXPECT_EQ(out, h);
  }
}

TEST(HandleCodec, UnknownVersionIsReportedNotDecoded) {
  // Version 1 (a process-wide token instead of a capability), 0 and a future 4.
  for (uint8_t version : {0, 1, 4, 255}) {
    Vmm2Handle h = Sample();
    h.version = version;
    unsigned char bytes[kHandleSize];
    EncodeHandle(h, bytes);
    Vmm2Handle out;
    EXPECT_EQ(DecodeHandle(bytes, &out), DecodeStatus::kUnknownVersion) << int(version);
  }
}

TEST(HandleCodec, ContradictingFieldsAreMalformed) {
  auto check = [](Vmm2Handle h) {
    unsigned char bytes[kHandleSize];
    EncodeHandle(h, bytes);
    Vmm2Handle out;
    return DecodeHandle(bytes, &out);
  };
  Vmm2Handle h = Sample();
  h.address = h.chunk_base + h.chunk_size;  // one past the chunk
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.capability = 0;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.instance = 0;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.region_base = h.chunk_base + 1;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.chunk_size = 0;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.pid = 0;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
  h = Sample();
  h.flags = 1;
  EXPECT_EQ(check(h), DecodeStatus::kMalformed);
}

}  // namespace
}  // namespace vmmipc::ledger
