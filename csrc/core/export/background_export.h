// BackgroundExport (VMMIPC_BACKGROUND_EXPORT): the chunks this process maps,
// exported into the exported-fd cache by one thread of their own before
// anyone asks, so that a later get is a lookup and the peers' opens find an
// fd to dup. The cuMemMap hook queues each chunk that get could share; the
// thread (started by the first such map, never before) exports them one at a
// time, at most one per `interval`, and never beside the driver work it would
// slow down (an export beside a peer's imports made them 2-3x slower; one
// beside a memory saver's resume made the resume ten times longer): work that
// is "busy" (BusyBegins/BusyEnds: this process's maps, unmaps and opens, the
// requests its listener serves, the exports its gets make) pauses it, and it
// goes on only `quiet` after the last of that work ended.
//
// The orders that can race, and what each gives:
//  - busy vs the thread: BusyBegins and BusyEnds count the work in progress
//    and stamp its end; the thread looks at both before each export, under
//    mutex_, with its waiting flag set before it reads the count (both
//    seq_cst), and BusyEnds reads the flag after its decrement: so either the
//    thread sees the work, or the work's end sees the thread waiting and wakes
//    it (under mutex_, so that the wake cannot fall between its look and its
//    wait). Work that begins while an export runs waits at most for that one
//    export (tens of us), never for the queue.
//  - a map and its unmap vs the thread: the queue holds (base, generation);
//    the export function (core/export/export_ahead.cc) finds the record and
//    exports only that generation, and the cache keeps the fd only while the
//    record is there with it (ledger::VmmMappings::CacheFd): an unmap before
//    the thread reaches the chunk costs nothing, one during its export costs
//    that export, whose fd is closed at once. The unmap's release of the
//    memory waits for that export's retained handle (tens of us).
//  - fork vs an export: the thread holds export_fork_mutex_ (a fork lock,
//    common/fork_lock.h) across each export and until its fd is in the cache
//    (or closed), so a fork either comes before the export begins or after
//    its fd is cached, where the forked child closes its copy with the
//    cache's: a child never holds a background export's fd. So a fork waits
//    for at most one export in progress. This is the one fork lock held
//    across a driver call and around others (the mapping table's, the export
//    keep-alive's): the fork handler takes it first (ExportSide::PrepareFork),
//    in the same order. The child has no such thread, and a fresh state
//    (core/process_state.cc): its own first map starts its own.
//  - exit vs an export: the driver tears itself down as the process exits,
//    and an export must not run on into that teardown (processes with this
//    on that exited right after a memory saver's resume ended in SIGSEGV).
//    Each export, from its first driver call to its fd's caching, is one
//    pass of the exit gate (common/exit_gate.h): the exit waits for the one
//    in progress, and none begins after it (the thread ends, its queue left).
//  - the queue is bounded (kMaxQueued): a chunk that does not fit is left to
//    its get, which exports it as without this thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/fork_lock.h"

namespace vmmipc::core {

class BackgroundExport {
 public:
  struct Chunk {
    uint64_t base = 0;
    uint32_t generation = 0;
  };
  // Exports one queued chunk (or decides not to); runs on the thread, under
  // the fork lock. Never throws.
  using ExportFn = void (*)(const Chunk& chunk);
  static constexpr size_t kMaxQueued = 4096;
  // In production: at most one export a millisecond (an export costs the
  // driver ~35 us: a few percent of its time while chunks are mapped), and
  // 50 ms of quiet after the last open, request served or get's export.
  static constexpr std::chrono::microseconds kInterval{1000};
  static constexpr std::chrono::microseconds kQuiet{50000};

  explicit BackgroundExport(std::chrono::microseconds interval = kInterval,
                            std::chrono::microseconds quiet = kQuiet)
      : interval_(interval), quiet_(quiet) {}
  BackgroundExport(const BackgroundExport&) = delete;
  BackgroundExport& operator=(const BackgroundExport&) = delete;
  // Stops the thread and joins it (tests: the process state is never destroyed).
  ~BackgroundExport();

  // From the cuMemMap hook: queues `chunk` for `export_fn`, starting the
  // thread on the first call (with `context`, the CUcontext of the mapping
  // thread, for context()). False when it is left to its get: the queue is
  // full, or the thread cannot start (then no later call starts one).
  bool Queue(const Chunk& chunk, ExportFn export_fn, void* context) noexcept;
  // The context the first queued chunk was mapped in, for the thread.
  void* context() const { return context_.load(std::memory_order_acquire); }

  // Work the exports must not run beside begins and ends (BusyScope): the
  // application's maps, unmaps and opens, the requests served, gets' exports.
  void BusyBegins() noexcept { busy_.fetch_add(1); }
  void BusyEnds() noexcept;

  // Whether the thread runs; how many chunks wait in the queue; whether it
  // waits for busy work to end now (tests).
  bool started() const;
  size_t queued() const;
  bool waiting_for_busy() const { return waiting_.load(); }

  // The fork handlers' (ExportSide): before a fork, waits for an export in
  // progress to be cached and holds the next one back; after it, in the
  // parent, lets it go. A forked child needs nothing of this: the thread is
  // the parent's, it holds no fd of its own, and the child abandons the
  // whole state that holds it (core/process_state.cc).
  void PrepareFork() noexcept { export_fork_mutex_.PrepareFork(); }
  void ParentAfterFork() noexcept { export_fork_mutex_.ParentAfterFork(); }

 private:
  void Loop(ExportFn export_fn);
  // Under `lock`: waits until nothing is busy and the quiet after the last
  // busy work has passed, or stop_. False on stop_.
  bool WaitForQuiet(std::unique_lock<std::mutex>& lock);

  const std::chrono::microseconds interval_;
  const std::chrono::microseconds quiet_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Chunk> queue_;              // under mutex_
  std::unique_ptr<std::thread> thread_;  // under mutex_
  bool start_failed_ = false;            // under mutex_
  bool stop_ = false;                    // under mutex_
  std::atomic<void*> context_{nullptr};

  std::atomic<int> busy_{0};
  std::atomic<int64_t> busy_ended_ns_{0};  // steady clock, when the last busy work ended
  std::atomic<bool> waiting_{false};       // the thread waits for busy work to end

  ForkMutex export_fork_mutex_;  // held by the thread across one export (above)
};

// Busy work for the life of this scope, when the background export is on:
// the application's map, unmap or open, a request served, a get's export.
class BusyScope {
 public:
  explicit BusyScope(BackgroundExport* background) : background_(background) {
    if (background_ != nullptr) background_->BusyBegins();
  }
  ~BusyScope() {
    if (background_ != nullptr) background_->BusyEnds();
  }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  BackgroundExport* background_;
};

}  // namespace vmmipc::core
