// The queue of announced handles and the thread that opens them ahead, in
// the application's gaps (ahead.h says the order).
#include "core/import/ahead.h"

#include "common/log.h"
#include "common/quiet_thread.h"

namespace vmmipc::core {

bool AheadWorker::Queue(const Handle& handle, OpenFn open) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || queue_.size() >= kMaxQueued) return false;
  if (!thread_) {
    try {
      thread_ = StartQuietThread("vmmipc-ahead", [this, open] { Loop(open); });
    } catch (...) {
      return false;
    }
    if (!thread_) return false;
  }
  queue_.push_back(handle);
  wake_.notify_one();
  return true;
}

void AheadWorker::AppOpenEnds() {
  // Read after the decrement (seq_cst): either the thread sees 0, or this
  // sees its waiting flag and wakes it (ahead.h).
  if (app_opens_.fetch_sub(1) == 1 && waiting_.load()) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_one();
  }
}

void AheadWorker::Loop(OpenFn open) {
  for (;;) {
    Handle handle;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (!stop_ && app_opens_.load() != 0) {
        // Only now are the application's opens told to wake this thread: an
        // idle one costs them nothing.
        waiting_.store(true);
        VMMIPC_LOG_DEBUG(
            "ahead: {} announced handle(s) wait for the application's opens in progress",
            queue_.size());
        wake_.wait(lock, [&] { return stop_ || app_opens_.load() == 0; });
        waiting_.store(false);
      }
      if (stop_) return;
      handle = queue_.front();
      queue_.pop_front();
    }
    open(handle);  // never throws (map_ahead.cc)
  }
}

AheadWorker::~AheadWorker() { StopQuietThread(mutex_, wake_, &stop_, &thread_); }

}  // namespace vmmipc::core
