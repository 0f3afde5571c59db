// Elapsed time in whole microseconds on the steady clock, for the phase
// timings of the debug log lines.
#pragma once

#include <chrono>
#include <cstdint>

namespace vmmipc {

using SteadyClock = std::chrono::steady_clock;

inline int64_t MicrosBetween(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration_cast<std::chrono::microseconds>(end - start).count();
}

inline int64_t MicrosSince(SteadyClock::time_point start) {
  return MicrosBetween(start, SteadyClock::now());
}

}  // namespace vmmipc
