// VMM2 handles as the peers' command lines carry them: 128 hex digits.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "ledger/handle_codec.h"

namespace vmmipc::testing {

inline ledger::Vmm2Handle Decode(const std::string& hex) {
  unsigned char bytes[ledger::kHandleSize] = {};
  for (size_t i = 0; i < ledger::kHandleSize && 2 * i + 1 < hex.size(); ++i)
    bytes[i] = static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  ledger::Vmm2Handle h;
  EXPECT_EQ(ledger::DecodeHandle(bytes, &h), ledger::DecodeStatus::kOk) << hex;
  return h;
}

inline std::string Encode(const ledger::Vmm2Handle& h) {
  unsigned char bytes[ledger::kHandleSize];
  ledger::EncodeHandle(h, bytes);
  std::string hex;
  char two[3];
  for (unsigned char b : bytes) {
    std::snprintf(two, sizeof(two), "%02x", b);
    hex += two;
  }
  return hex;
}

}  // namespace vmmipc::testing
