// Timeout: the bound of the socket protocol's waits (VMMIPC_TIMEOUT_MS) as one
// value, made once from the configuration (config::Params::timeout(), whose
// range check keeps it within 1 ms .. 1 h) and handed down: transport's
// options take it, so nothing below re-reads the variable, casts it or
// clamps it again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace vmmipc {

class Timeout {
 public:
  // 5 s, VMMIPC_TIMEOUT_MS's default.
  constexpr Timeout() = default;
  // `ms` milliseconds, at least 1: a bound of 0 or less (which only a test
  // can ask for; the configuration refuses it) still lets each wait try once.
  static constexpr Timeout Ms(int64_t ms) {
    return Timeout(static_cast<int>(std::clamp<int64_t>(ms, 1, std::numeric_limits<int>::max())));
  }
  constexpr int ms() const { return ms_; }

 private:
  constexpr explicit Timeout(int ms) : ms_(ms) {}
  int ms_ = 5000;
};

}  // namespace vmmipc
