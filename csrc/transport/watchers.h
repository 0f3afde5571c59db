// Watchers: the exporter's kept watch connections, one per importer that
// asked for one (kRequestFlagWatch on a request that was served), and the
// events sent on them when the exporter unmaps or maps again memory that
// importers hold (a memory saver's pause and resume: docs/protocol.md,
// "Follow"). An event goes only to the importers named with it (those the
// chunk was granted to); the caller waits for their acks, bounded.
//
// Threads: Adopt runs on the listener's threads, Notify on the thread that
// unmaps or maps (the application's). One Notify at a time reads acks
// (notify_mutex_); the list itself is guarded by list_mutex_, held only to
// add, remove or copy entries, never across I/O. Entries are shared_ptrs so
// that a Notify in progress keeps the ones it is talking to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/scoped_fd.h"
#include "transport/siphash.h"
#include "transport/wire.h"

namespace vmmipc::transport {

struct WatchNotice {
  wire::EventKind kind = wire::EventKind::kPause;
  uint64_t base = 0;  // the chunk's base in this (the exporter's) process
  uint64_t size = 0;
  uint64_t generation = 0;     // kPause: the one unmapped; kResume: the new one
  int fd = -1;                 // kResume: the new memory's exported fd (borrowed), sent along
  std::vector<uint32_t> pids;  // the importers it is for
};

struct NotifyResult {
  std::vector<std::vector<uint32_t>> done;  // per notice: the pids that answered kDone
  std::vector<uint32_t> unanswered;         // pids still connected that did not answer in time
  size_t events_sent = 0;
};

class Watchers {
 public:
  // At most this many watch connections; past it a request's connection is
  // closed after its reply as without the flag (its importer is not told).
  static constexpr size_t kMaxWatchers = 4096;

  // Keeps `fd`, just answered, for events to importer `pid`. `key` and
  // `nonce` are those of its request: they MAC every event and ack. Drops
  // entries whose importer hung up. False (the caller closes `fd`) when full.
  bool Adopt(ScopedFd fd, uint32_t pid, const SipKey& key, const wire::Nonce& nonce);

  // Sends every notice to the watchers of its pids, then waits for their
  // acks until `timeout_ms` passes or `stop_fd` becomes readable. Watchers
  // that hung up, or answered out of protocol, are dropped.
  NotifyResult Notify(const std::vector<WatchNotice>& notices, int timeout_ms, int stop_fd);

  size_t count() const;

  // A forked child: the connections belong to the parent's importers.
  // Forgets them without touching the parent's locks' state.
  void AbandonAfterFork() noexcept;

 private:
  struct Watcher;
  void Drop(const std::shared_ptr<Watcher>& watcher);
  mutable std::mutex list_mutex_;
  std::mutex notify_mutex_;
  std::vector<std::shared_ptr<Watcher>> list_;
};

}  // namespace vmmipc::transport
