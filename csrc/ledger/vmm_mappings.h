// VmmMappings: the process's own VMM mappings, as made through cuMemMap and
// undone through cuMemUnmap, so that cuIpcGetMemHandle and the listener can
// describe exported memory without asking the driver. Each mapping gets a
// generation when it is made: memory unmapped and mapped again at the same
// address is new memory to an importer.
//
// It also keeps the exported-fd cache: at most one exported POSIX fd per
// mapping, made on the first request for it and dup()ed for every grant, so
// that N importers of one chunk cost one export, and so that the process
// always holds a live exported fd while it serves (the driver sets up its
// export state when the process's count of live exported fds goes from 0 to
// 1, and tears it down inside close() when it returns to 0:
// docs/driver-behaviour.md#export-cliff). A cached fd lives exactly as long as its mapping's
// record: the record is taken out before the driver unmaps, and the fd is closed by whoever took
// it, never under the lock.
//
// Locking: one reader-writer mutex guards the records and the cache; it is
// never held across a driver call or a close(); dup() runs under it so that
// a concurrent Take cannot close the fd being duplicated. It is a fork lock
// (common/fork_lock.h): a fork waits for its holders, so that a forked child
// always finds the cache whole and closes its copies of the fds.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "common/fork_lock.h"
#include "common/scoped_fd.h"

namespace vmmipc::ledger {

struct VmmMapping {
  uint64_t base = 0;  // the mapping: [base, base + size)
  uint64_t size = 0;
  uint64_t offset = 0;  // into its allocation (vmmipc exports offset-0 mappings only)
  uint32_t generation = 0;
  bool posix_fd_exportable = false;
  int32_t device = -1;       // ordinal of the GPU that holds the memory; -1 not a device
  uint64_t region_base = 0;  // what importers mirror: the arena or the reservation
  uint64_t region_end = 0;   // where a run of chunks stops: the end of the reservation
  // Filled by Find(): the exported-fd cache holds an fd for this mapping.
  bool fd_cached = false;
};

// What Take() removed: records to restore if the driver refuses the unmap,
// and cached fds to close once the lock is released.
struct TakenMappings {
  std::vector<VmmMapping> records;
  std::vector<ScopedFd> fds;
  // Per record: the followers (importers' follower ids) it was granted to,
  // when follow records them (StillMapped, AddHolder); they are told of the unmap.
  std::vector<std::vector<uint32_t>> holders;
  // Per record: the importers (pids, as the listener saw them) it was granted
  // to without follow (StillMapped): they are not told of the unmap, and
  // keep the memory for as long as they map it.
  std::vector<std::vector<uint32_t>> unfollowed;
};

// A chunk unmapped while importers held it (a memory saver's pause): who
// followed the pause, so that a mapping made at the same base can be pushed
// to them (follow).
struct PausedChunk {
  uint64_t base = 0;
  uint64_t size = 0;
  std::vector<uint32_t> holders;
};

class VmmMappings {
 public:
  // Records a new mapping (replacing any record it overlaps; their cached
  // fds are closed) and returns its generation.
  uint32_t Add(VmmMapping mapping);
  // Takes out every mapping that overlaps [base, base + size) with its
  // cached fd. Call before the driver unmaps, so no request can see a record
  // whose memory is already gone.
  TakenMappings Take(uint64_t base, uint64_t size);
  // Puts back records taken out (the unmap failed); their fds are not restored.
  void Restore(const std::vector<VmmMapping>& records);
  // Forgets every mapping that overlaps [base, base + size).
  void Remove(uint64_t base, uint64_t size) { Take(base, size); }
  std::optional<VmmMapping> Find(uint64_t address) const;
  // The run of mappings that starts exactly at `base` and continues while the
  // next mapping starts where the previous one ends, below `end`; at most
  // `max_chunks` records. One consistent snapshot.
  std::vector<VmmMapping> Run(uint64_t base, uint64_t end, size_t max_chunks) const;
  // True when every record of `run` is still in the table with its
  // generation; then, when `follower` is not 0, records it as a holder of
  // each, in the same step: an unmap (Take) either comes first, and the grant
  // is refused, or sees the holder, and tells it. `unfollowed_pid` (not 0):
  // an importer granted the run without follow, recorded likewise (at most
  // kMaxUnfollowedPerChunk per record: enough to name who pins the memory).
  bool StillMapped(const std::vector<VmmMapping>& run, uint32_t follower = 0,
                   uint32_t unfollowed_pid = 0);
  static constexpr size_t kMaxUnfollowedPerChunk = 8;
  // Stands for an importer granted a run whose pid is outside this pid
  // namespace (SO_PEERCRED reads 0 for it, which StillMapped takes for none).
  static constexpr uint32_t kUnknownPid = 0xFFFFFFFFu;
  size_t size() const;

  // Follow: who holds what.
  // Records that `follower` holds the mapping at `base` of `generation`.
  void AddHolder(uint64_t base, uint32_t generation, uint32_t follower);
  // Remembers a chunk the importers `holders` unmapped with the exporter.
  // Bounded: past kMaxPaused the oldest is forgotten (its importers then
  // keep their range unmapped after a resume; close still works).
  void NotePaused(PausedChunk chunk);
  // The paused chunk at exactly `base`, taken out; nullopt when none.
  std::optional<PausedChunk> TakePaused(uint64_t base);
  static constexpr size_t kMaxPaused = 65536;

  // The exported-fd cache.
  // Caps the number of cached fds (at least 1). Past the cap the least
  // recently used fd is closed, never the last one.
  void SetFdCacheLimit(size_t limit);
  // A new CLOEXEC dup of the cached fd of the mapping at `base` of
  // `generation`; invalid when none is cached.
  ScopedFd DupCachedFd(uint64_t base, uint32_t generation);
  // Caches `fd` (just exported) for the mapping at `base` of `generation`
  // and returns a dup of it for the caller to send. When the mapping is gone
  // or changed, or already has an fd, returns `fd` itself, uncached. Fds
  // evicted to stay under the limit are moved to `*evicted` (close them
  // outside any lock).
  ScopedFd CacheFd(uint64_t base, uint32_t generation, ScopedFd fd, std::vector<ScopedFd>* evicted);
  size_t cached_fd_count() const;
  // The fork handlers' (core/process_state.cc): before a fork, takes the
  // table's lock (waiting for its holders); after it, releases it in the parent.
  void PrepareFork() noexcept { mutex_.PrepareFork(); }
  void ParentAfterFork() noexcept { mutex_.ParentAfterFork(); }
  // In a forked child: closes the copies of every cached fd and forgets them.
  // False, touching nothing, only when the thread that forked held the table
  // itself (a fork from a signal handler: ForkSharedMutex).
  bool CloseCachedFdsInForkedChild();

 private:
  struct Record {
    VmmMapping mapping;
    ScopedFd fd;                       // the exported fd, when cached
    uint64_t last_use = 0;             // cache clock, for eviction
    std::vector<uint32_t> holders;     // followers granted it (follow only)
    std::vector<uint32_t> unfollowed;  // pids granted it without follow
  };
  void TakeLocked(uint64_t base, uint64_t size, TakenMappings* taken);
  mutable ForkSharedMutex mutex_;
  std::map<uint64_t, Record> records_;      // by base
  std::map<uint64_t, PausedChunk> paused_;  // by base
  std::vector<uint64_t> paused_order_;      // bases, oldest first, for the bound
  uint32_t next_generation_ = 0x80000000u;  // apart from handle generations (ChunkGenerations)
  size_t fd_limit_ = 1024;
  // Written under mutex_; read without it by cached_fd_count(), which every
  // get asks (a second shared lock per get cost more than the rest of it).
  std::atomic<size_t> cached_fds_{0};
  uint64_t clock_ = 0;
};

}  // namespace vmmipc::ledger
