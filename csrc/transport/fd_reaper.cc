// One lazily started thread draining a bounded queue of fds to close.
#include "transport/fd_reaper.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/parked.h"
#include "common/quiet_thread.h"

namespace vmmipc::transport {
namespace {

// More than this many fds waiting means the reaper is stuck behind a close
// that will not return; closing inline then is the lesser harm than holding
// fds without bound.
constexpr size_t kMaxPending = 4096;

struct Reaper {
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<int> queue;  // guarded by mutex
  bool started = false;   // guarded by mutex
  bool overflow_warned = false;
  std::atomic<size_t> pending{0};

  void Run() noexcept {
    std::unique_lock lock(mutex);
    while (true) {
      wake.wait(lock, [this] { return !queue.empty(); });
      const int fd = queue.front();
      queue.pop_front();
      lock.unlock();
      ScopedFd closing(fd);  // the close that may block, on this thread only
      closing.Reset();
      pending.fetch_sub(1, std::memory_order_relaxed);
      lock.lock();
    }
  }
};

// Never destroyed: the thread runs until the process exits.
std::atomic<Reaper*> g_reaper{nullptr};
std::mutex g_create_mutex;

Reaper& Get() {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  if (reaper != nullptr) return *reaper;
  std::lock_guard lock(g_create_mutex);
  reaper = g_reaper.load(std::memory_order_relaxed);
  if (reaper == nullptr) {
    reaper = new Reaper();
    g_reaper.store(reaper, std::memory_order_release);
  }
  return *reaper;
}

bool StartLocked(Reaper& reaper) {
  if (reaper.started) return true;
  try {
    std::unique_ptr<std::thread> thread =
        StartQuietThread("vmmipc-reaper", [&reaper] { reaper.Run(); });
    thread->detach();
    reaper.started = true;
  } catch (const std::exception& e) {
    VMMIPC_LOG_WARN("cannot start the fd reaper thread: {}; closing inline", e.what());
  }
  return reaper.started;
}

}  // namespace

void CloseInBackground(ScopedFd fd) noexcept {
  if (!fd.valid()) return;
  try {
    Reaper& reaper = Get();
    std::unique_lock lock(reaper.mutex);
    if (reaper.queue.size() < kMaxPending && StartLocked(reaper)) {
      reaper.queue.push_back(fd.Release());
      reaper.pending.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      reaper.wake.notify_one();
      return;
    }
    if (!reaper.overflow_warned) {
      reaper.overflow_warned = true;
      VMMIPC_LOG_WARN(
          "fd reaper: {} fds wait for a close that does not return; closing on "
          "the caller's thread from now on",
          reaper.queue.size());
    }
  } catch (...) {
    // Out of memory for the queue: fall through to the inline close.
  }
  fd.Reset();
}

void ResetReaperAfterFork() noexcept {
  Park(g_reaper.load(std::memory_order_relaxed));
  new (&g_create_mutex) std::mutex();
  g_reaper.store(nullptr, std::memory_order_release);
}

size_t ReaperPendingForTesting() noexcept {
  Reaper* reaper = g_reaper.load(std::memory_order_acquire);
  return reaper == nullptr ? 0 : reaper->pending.load(std::memory_order_relaxed);
}

}  // namespace vmmipc::transport
