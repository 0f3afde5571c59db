// The background export's queue, its thread and its pause (background_export.h
// says the orders).
#include "core/export/background_export.h"

#include <unistd.h>

#include <cstdlib>

#include "common/log.h"
#include "common/quiet_thread.h"

namespace vmmipc::core {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The exit handler's object: the one whose thread runs, and the pid of the
// process that started it (a forked child inherits the handler, not the
// thread).
constinit std::atomic<BackgroundExport*> g_exit_owner{nullptr};
constinit std::atomic<pid_t> g_exit_owner_pid{0};
constinit std::atomic<bool> g_exit_handler{false};

void StopAtExit() {
  BackgroundExport* owner = g_exit_owner.load(std::memory_order_acquire);
  if (owner != nullptr && g_exit_owner_pid.load(std::memory_order_acquire) == ::getpid())
    owner->StopForExit();
}

// With the thread's start, never at load (nothing at load may fail). A
// registration that fails leaves the exit unguarded, said once.
void GuardExit(BackgroundExport* owner) {
  g_exit_owner_pid.store(::getpid(), std::memory_order_release);
  g_exit_owner.store(owner, std::memory_order_release);
  if (!g_exit_handler.exchange(true) && std::atexit(StopAtExit) != 0) {
    g_exit_handler = false;
    VMMIPC_LOG_WARN(
        "background export: no exit handler could be registered; an export in "
        "progress at exit may meet the driver's teardown");
  }
}

}  // namespace

bool BackgroundExport::Queue(const Chunk& chunk, ExportFn export_fn, void* context) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || start_failed_ || queue_.size() >= kMaxQueued) return false;
  try {
    if (!thread_) {
      context_.store(context, std::memory_order_release);
      thread_ = StartQuietThread("vmmipc-export", [this, export_fn] { Loop(export_fn); });
      GuardExit(this);
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
    const Chunk chunk = queue_.front();
    queue_.pop_front();
    lock.unlock();
    {
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

void BackgroundExport::StopForExit() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  // Held until the process is gone: the export in progress ends first, and
  // the thread, should it pass its stop check now, waits here for good. Not
  // from a thread that holds a fork lock (it could be this one's).
  if (ThisThreadHoldsForkLocks() || exit_hold_) return;
  export_fork_mutex_.lock();
  exit_hold_ = true;
}

BackgroundExport::~BackgroundExport() {
  BackgroundExport* self = this;
  g_exit_owner.compare_exchange_strong(self, nullptr);
  // Tests only (the process state is never destroyed): a StopForExit's hold
  // is let go, on its thread, so that the join cannot wait on it.
  if (exit_hold_) export_fork_mutex_.unlock();
  StopQuietThread(mutex_, wake_, &stop_, &thread_);
}

}  // namespace vmmipc::core
