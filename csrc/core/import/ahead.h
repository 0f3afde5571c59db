// AheadWorker: the importer's half of ahead (VMMIPC_AHEAD). Its exporters
// announce each handle their application hands out (the follow thread queues
// them here: the run's announced state); one thread advances each to mapped
// ahead of the application (core/import/map_ahead.cc, the open's own steps),
// so that the application's own open of the handle finds it mapped and
// adopts it (ledger/import_table.h, RunState).
//
// The thread works only in the application's gaps: it starts a run
// only while no open of the application's is in progress (counted by
// AppOpenBegins/AppOpenEnds around an open's slow path). Measured on an H200:
// imports beside the application's opens made a whole registration 8-27%
// slower, the driver serialising both. So:
//  - an application open that begins while a run is mapped ahead waits at most
//    for that one open's driver calls, never for the queue;
//  - a run is never begun ahead while an application open is in progress; it
//    checks after taking its handle, under the queue's lock, with the
//    counter read after its waiting flag is set (both seq_cst), so that an
//    application open that ends meanwhile always wakes it.
// An announcement the queue has no room for is dropped (counted): ahead
// only saves time; a dropped one is opened the usual way.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace vmmipc::core {

class AheadWorker {
 public:
  static constexpr size_t kMaxQueued = 1024;
  using Handle = std::array<uint8_t, 64>;
  using OpenFn = void (*)(const Handle& handle);

  AheadWorker() = default;
  AheadWorker(const AheadWorker&) = delete;
  AheadWorker& operator=(const AheadWorker&) = delete;
  ~AheadWorker();  // stops the thread and joins it

  // Queues `handle` for `open` on the thread (started by the first call).
  // False when the queue is full or the thread cannot start: dropped.
  bool Queue(const Handle& handle, OpenFn open);

  // The application's open (its slow path) begins and ends.
  void AppOpenBegins() { app_opens_.fetch_add(1); }
  void AppOpenEnds();

 private:
  void Loop(OpenFn open);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Handle> queue_;             // under mutex_
  std::unique_ptr<std::thread> thread_;  // under mutex_
  bool stop_ = false;                    // under mutex_
  std::atomic<int> app_opens_{0};
  std::atomic<bool> waiting_{false};  // the thread waits for the application's opens to end
};

// The application's open in progress, for the life of this scope.
class AppOpenScope {
 public:
  explicit AppOpenScope(AheadWorker& ahead) : ahead_(ahead) { ahead_.AppOpenBegins(); }
  ~AppOpenScope() { ahead_.AppOpenEnds(); }
  AppOpenScope(const AppOpenScope&) = delete;
  AppOpenScope& operator=(const AppOpenScope&) = delete;

 private:
  AheadWorker& ahead_;
};

}  // namespace vmmipc::core
