// The background export's queue, its thread and its pause (background_export.h
// says the orders).
#include "core/export/background_export.h"

#include "common/exit_gate.h"
#include "common/log.h"
#include "common/quiet_thread.h"

namespace vmmipc::core {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool BackgroundExport::Queue(const Chunk& chunk, ExportFn export_fn, void* context) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || start_failed_ || queue_.size() >= kMaxQueued) return false;
  try {
    if (!thread_) {
      context_.store(context, std::memory_order_release);
      thread_ = StartQuietThread("vmmipc-export", [this, export_fn] { Loop(export_fn); });
    }
    queue_.push_back(chunk);
  } catch (...) {
    if (!thread_) {
      start_failed_ = true;
      VMMIPC_LOG_WARN(
          "background export: no thread could start; every chunk is exported at its first get");
    }
    return false;
  }
  wake_.notify_one();
  return true;
}

void BackgroundExport::BusyEnds() noexcept {
  // The end is stamped before the count drops, so that a thread that reads 0
  // also reads this end (seq_cst); the flag is read after the decrement, so
  // that either the thread sees 0 or this sees it waiting (the header).
  busy_ended_ns_.store(NowNs());
  if (busy_.fetch_sub(1) == 1 && waiting_.load()) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_one();
  }
}

bool BackgroundExport::started() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return thread_ != nullptr;
}

size_t BackgroundExport::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

bool BackgroundExport::WaitForQuiet(std::unique_lock<std::mutex>& lock) {
  bool said = false;
  for (;;) {
    if (stop_) return false;
    waiting_.store(true);
    if (busy_.load() != 0) {
      // Only now is the busy work told to wake this thread: an idle one
      // costs it nothing.
      if (!said) {
        VMMIPC_LOG_DEBUG(
            "background export: {} chunk(s) wait for the maps, unmaps, opens, requests or gets in "
            "progress",
            queue_.size());
        said = true;
      }
      wake_.wait(lock, [&] { return stop_ || busy_.load() == 0; });
      continue;
    }
    waiting_.store(false);
    const int64_t quiet_until =
        busy_ended_ns_.load() +
        std::chrono::duration_cast<std::chrono::nanoseconds>(quiet_).count();
    const int64_t now = NowNs();
    if (busy_ended_ns_.load() == 0 || now >= quiet_until) return true;
    wake_.wait_for(lock, std::chrono::nanoseconds(quiet_until - now));
  }
}

void BackgroundExport::Loop(ExportFn export_fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (!WaitForQuiet(lock)) return;
    if (queue_.empty()) continue;
    {
      // The whole export passes the exit gate: an exit waits for it, and
      // none begins after one (the header, "exit vs an export").
      ExitGatePass pass;
      if (!pass.open()) return;  // the process exits: the queue stays
      const Chunk chunk = queue_.front();
      queue_.pop_front();
      lock.unlock();
      // Across the export and until its fd is cached or closed: a fork waits
      // for it (the header, "fork vs an export").
      std::lock_guard<ForkMutex> fork_hold(export_fork_mutex_);
      export_fn(chunk);  // never throws (core/export/export_ahead.cc)
    }
    lock.lock();
    // The rate: at most one export per interval, whatever is queued.
    if (wake_.wait_for(lock, interval_, [&] { return stop_; })) return;
  }
}

BackgroundExport::~BackgroundExport() { StopQuietThread(mutex_, wake_, &stop_, &thread_); }

}  // namespace vmmipc::core
