// ExportSide: what this process keeps to export its own VMM memory: chunk
// generations, the table of its own mappings (with the exported-fd cache),
// the listener that answers peers, the queue of chunks to export ahead of
// their first request, the background export (core/export/background_export.h,
// its own lock and thread) and the export arena its own reservations are
// carved from (core/arena/arena_side.h, its own lock).
//
// Locking:
//  - generations() and mappings() lock themselves.
//  - export_mutex_ guards the start of the listener (listener_,
//    listener_failed_, export_context_). Get takes it (EnsureListener) only
//    until listener_ready() is true; export_context_ is written before the
//    listener's threads start and listener_ never changes once ready, so
//    listener() and export_context() take no lock.
//  - ahead_mutex_ guards the export-ahead queue. It is held only to push or
//    swap the list, never across an export.
//  - warm_up_mutex_ is held while the warm-up before the first export runs
//    (driver calls, once per process); later exports see
//    warmed_up_ and take no lock. The export keep-alive it makes is kept under
//    keepalive_mutex_, which is never held across a driver call.
//  - Fork: the background export's export lock, the mapping table's lock,
//    keepalive_mutex_ and the listener's watch list are fork locks
//    (common/fork_lock.h), taken by the fork handler in that order
//    (PrepareFork), so that a forked child can always close its copies of the
//    cache's fds, the keep-alive and the watch connections, and never holds a
//    background export's fd. Each but the first is held only to read or write
//    what it guards (a dup() of a cached fd under the table's, a poll() that
//    does not wait under the watch list's), never across I/O, a driver call or
//    another lock; the first is held across one background export, around
//    the table's and the keep-alive's (background_export.h), which is why it
//    comes first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/fork_lock.h"
#include "common/scoped_fd.h"
#include "core/arena/arena_side.h"
#include "core/export/background_export.h"
#include "ledger/chunk_generations.h"
#include "ledger/vmm_mappings.h"
#include "transport/serve/listener/listener.h"

namespace vmmipc::core {

class ExportSide {
 public:
  ledger::ChunkGenerations& generations() { return generations_; }
  // Own VMM mappings, from the cuMemMap/cuMemUnmap hooks.
  ledger::VmmMappings& mappings() { return mappings_; }
  // The export arena (core/arena/export_arena.h).
  ArenaSide& arena() { return arena_; }
  // The background export (VMMIPC_BACKGROUND_EXPORT; its thread starts with
  // the first chunk queued).
  BackgroundExport& background() { return background_; }

  // True once the listener runs; then listener() and export_context() are set.
  bool listener_ready() const { return listener_ready_.load(std::memory_order_acquire); }
  transport::Listener& listener() { return *listener_; }
  // The CUcontext current at the first export, for the listener's threads.
  void* export_context() const { return export_context_; }

  // Starts the listener on the first export: `start(&context)` runs under
  // export_mutex_ once, writes the context the listener's threads will use
  // (before it starts them) and returns the listener, or null when it cannot
  // start. A failure is remembered: later calls fail at once, without `start`.
  // Returns whether the listener runs.
  template <typename Start>
  bool EnsureListener(Start start) {
    if (listener_ready()) return true;
    std::lock_guard<std::mutex> lock(export_mutex_);
    if (listener_) return true;
    if (listener_failed_) return false;
    listener_ = start(&export_context_);
    if (!listener_) {
      listener_failed_ = true;
      return false;
    }
    listener_ready_.store(true, std::memory_order_release);
    return true;
  }

  // Queues the chunk at `address` for export ahead of its first request.
  // True when the caller must post a drain task (none is pending); false
  // when one is, the queue is full or out of memory (then the chunk is
  // exported when first requested, as without the queue).
  bool QueueExportAhead(uint64_t address) noexcept;
  // The drain task's next batch: everything queued, swapped into `batch`.
  // False when nothing was queued: the drain ends and the next get posts one.
  bool TakeExportAhead(std::vector<uint64_t>* batch);
  // Posting the drain task failed: forgets the queue.
  void DropExportAhead() noexcept;

  // The warm-up before the first export (core/export/export_keepalive.h): `warm_up()`
  // runs once, under warm_up_mutex_; a caller that comes while it runs waits
  // for its end, so that no export (and no answer) leaves before it is done.
  template <typename WarmUp>
  void WarmUpOnce(WarmUp warm_up) {
    if (warmed_up_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(warm_up_mutex_);
    if (warmed_up_.load(std::memory_order_relaxed)) return;
    warm_up();
    warmed_up_.store(true, std::memory_order_release);
  }
  // Keeps the keep-alive's allocation handle and its exported fd until exit.
  void HoldExportKeepAlive(uint64_t handle, ScopedFd fd);

  // The fork handlers' (core/process_state.cc): before a fork, takes the fork
  // locks above (waiting for their holders); after it, in the parent, releases them.
  void PrepareFork() noexcept;
  void ParentAfterFork() noexcept;
  // In a forked child: closes its copies of the parent's cached exported fds
  // and of the keep-alive (they would keep the parent's memory alive) and
  // abandons the listener, whose threads are the parent's.
  void AbandonAfterFork();

 private:
  // More queued than this and a get no longer queues.
  static constexpr size_t kMaxExportAhead = 4096;

  ledger::ChunkGenerations generations_;
  ledger::VmmMappings mappings_;
  ArenaSide arena_;
  BackgroundExport background_;

  std::mutex export_mutex_;
  std::unique_ptr<transport::Listener> listener_;
  std::atomic<bool> listener_ready_{false};  // lets get skip export_mutex_ once started
  void* export_context_ = nullptr;
  bool listener_failed_ = false;

  std::mutex warm_up_mutex_;
  std::atomic<bool> warmed_up_{false};
  ForkMutex keepalive_mutex_;
  uint64_t keepalive_handle_ = 0;  // never released: the process keeps it to its end
  ScopedFd keepalive_fd_;

  std::mutex ahead_mutex_;
  std::vector<uint64_t> ahead_;
  bool ahead_queued_ = false;  // a drain task is posted and has not finished
};

// This process's export side; makes the process state (core/process_state.cc)
// on the first call.
ExportSide& Exporter();

}  // namespace vmmipc::core
