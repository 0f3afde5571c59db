// The rate limit of repeatable log lines (log_limit.h): admission on atomics,
// and the two lines that say what was left out.
#include "common/log_limit.h"

#include <chrono>

namespace vmmipc::log {
namespace {

// Bumped in every forked child; a limit whose epoch differs drops its counts.
std::atomic<uint32_t> g_fork_epoch{0};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LineLimit::Verdict LineLimit::Admit(int64_t now_ms) noexcept {
  Verdict verdict;
  const uint32_t epoch = g_fork_epoch.load(std::memory_order_relaxed);
  uint32_t mine = fork_epoch_.load(std::memory_order_relaxed);
  if (mine != epoch && fork_epoch_.compare_exchange_strong(mine, epoch)) {
    // A forked child: what its parent wrote and left out is the parent's to say.
    window_start_.store(kNoWindow, std::memory_order_relaxed);
    in_window_.store(0, std::memory_order_relaxed);
    left_out_.store(0, std::memory_order_relaxed);
  }
  // One thread opens each window (the compare-exchange) and takes the count
  // of the windows before. A racing thread may still count a line in the old
  // window: it is then said with the next count, never lost or said twice.
  int64_t start = window_start_.load(std::memory_order_relaxed);
  if ((start == kNoWindow || now_ms - start >= window_ms_) &&
      window_start_.compare_exchange_strong(start, now_ms, std::memory_order_relaxed)) {
    in_window_.store(0, std::memory_order_relaxed);
    verdict.left_out = left_out_.exchange(0, std::memory_order_relaxed);
  }
  // Stops counting just past the limit, so that no flood wraps it around.
  uint32_t seen = in_window_.load(std::memory_order_relaxed);
  if (seen <= lines_) seen = in_window_.fetch_add(1, std::memory_order_relaxed);
  if (seen < lines_) {
    verdict.write = true;
    return verdict;
  }
  verdict.limit_reached = seen == lines_;
  left_out_.fetch_add(1, std::memory_order_relaxed);
  return verdict;
}

LineLimit::Verdict LineLimit::Admit() noexcept { return Admit(NowMs()); }

void ResetLineLimitsAfterFork() noexcept { g_fork_epoch.fetch_add(1, std::memory_order_relaxed); }

bool Admitted(LineLimit& limit, Level level, std::string_view subject, std::string_view what,
              int64_t now_ms) noexcept {
  const LineLimit::Verdict verdict = limit.Admit(now_ms);
  const int64_t seconds = limit.window_ms() / 1000;
  if (verdict.left_out != 0)
    Log(level, "{}: {} more {} were not logged (at most {} are per {} s)", subject,
        verdict.left_out, what, limit.lines(), seconds);
  if (verdict.limit_reached)
    Log(level, "{}: more than {} {} within {} s; the rest are counted, not logged, until then",
        subject, limit.lines(), what, seconds);
  return verdict.write;
}

bool Admitted(LineLimit& limit, Level level, std::string_view subject,
              std::string_view what) noexcept {
  return Admitted(limit, level, subject, what, NowMs());
}

}  // namespace vmmipc::log
