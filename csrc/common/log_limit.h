// LineLimit: the one rate limit for log lines that a caller can repeat at
// will: an application that retries a failing cuIpcOpenMemHandle in a loop
// (455,000 lines in 8 s before this limit), a flood of connections to the
// listener. Of each limited site (or group of sites sharing one LineLimit),
// the first `lines` lines of a window of `window_ms` are written; the first
// one past that is replaced by one line saying that more are left out, and
// the rest are counted; the first line of a later window is preceded by one
// line with that count. Atomics only, no lock: a forked child inherits none
// held, and its counts start afresh (log::ResetAfterFork).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common/log.h"

namespace vmmipc::log {

class LineLimit {
 public:
  static constexpr uint32_t kLines = 20;
  static constexpr int64_t kWindowMs = 10000;

  // constexpr: a LineLimit of static storage is ready before any code runs
  // (a function-local one needs no guard).
  constexpr explicit LineLimit(uint32_t lines = kLines, int64_t window_ms = kWindowMs)
      : lines_(lines), window_ms_(window_ms) {}
  LineLimit(const LineLimit&) = delete;
  LineLimit& operator=(const LineLimit&) = delete;

  struct Verdict {
    bool write = false;          // this line may be written
    uint64_t left_out = 0;       // before it: lines left out in the windows before this one
    bool limit_reached = false;  // the first line left out in this window
  };
  // The verdict on one line at `now_ms`, a steady clock in milliseconds
  // (tests pass their own).
  Verdict Admit(int64_t now_ms) noexcept;
  Verdict Admit() noexcept;

  uint32_t lines() const { return lines_; }
  int64_t window_ms() const { return window_ms_; }

 private:
  static constexpr int64_t kNoWindow = INT64_MIN;

  const uint32_t lines_;
  const int64_t window_ms_;
  std::atomic<uint32_t> fork_epoch_{0};  // the process (parent, forked child) the counts are of
  std::atomic<int64_t> window_start_{kNoWindow};
  std::atomic<uint32_t> in_window_{0};  // lines seen in this window, stops just past lines_
  std::atomic<uint64_t> left_out_{0};   // left out since the last count was said
};

// A forked child's limits count from zero (log::ResetAfterFork calls it).
void ResetLineLimitsAfterFork() noexcept;

// Admits one line of `limit` at `level`, and writes what the verdict asks
// for before it: "<subject>: <n> more <what> were not logged (at most <lines>
// are per <s> s)", or instead of it "<subject>: more than <lines> <what>
// within <s> s; the rest are counted, not logged, until then". True when the
// line itself may be written.
bool Admitted(LineLimit& limit, Level level, std::string_view subject, std::string_view what,
              int64_t now_ms) noexcept;
bool Admitted(LineLimit& limit, Level level, std::string_view subject,
              std::string_view what) noexcept;

// VMMIPC_LOG_* through `limit`: for a line a caller can repeat at will.
template <typename... Args>
void LogLimited(LineLimit& limit, Level level, std::string_view subject, std::string_view what,
                fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!Enabled(level) || !Admitted(limit, level, subject, what)) return;
  Log(level, format, std::forward<Args>(args)...);
}

}  // namespace vmmipc::log
