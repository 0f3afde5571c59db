// ImportSide: what this process keeps of the memory it opened from peers:
// the import table, the placement locks, the import zone, the opens in
// flight, and (follow) its ImportFollow, the watch client that hears its
// exporters' pauses and resumes (core/import/import_follow.h, its own lock
// rule).
//
// Locking:
//  - import_mutex_ guards the table. It is held only while the table is read
//    or written (the methods below, and WithAnchors): never across socket
//    I/O or a driver call, so pointer queries and opens of other exporters
//    never wait behind an open.
//  - placement_mutex(slot, pid) serialises the placement and the driver calls
//    (map, set access, unmap) of the opens and closes of one rank slot of the
//    zone (or, for an unranked exporter, of one exporter), so that a chunk
//    being unmapped by a close is never probed free and mapped over by an
//    open, and two opens of one handle agree on one pointer. Opens of
//    exporters in other slots run in parallel; fetching fds from the exporter
//    happens before it is taken. Taken before import_mutex_, never after it.
//  - zone_mutex_ guards the zone's reservation; the zone never changes once
//    Zone() has returned.
//  - The page-table anchors' table (ledger/zone_anchor_table.h) is read and
//    written under import_mutex_ too (WithAnchors); what is done to one
//    slot's anchors (map, unmap) is done under that slot's placement lock.
//    anchor_memory_mutex_ guards the anchors' memory, one allocation per
//    device, and is held across the cuMemCreate that makes it (once per
//    device); taken after a placement lock, never with import_mutex_.
//  - The in-flight opens (ledger/in_flight_opens.h) are read and written
//    under import_mutex_: they stay here, not in ImportFollow, because an
//    open takes its log and looks the table up in one hold of it. The
//    follow thread handles an event under every placement lock of the
//    exporter's opens, in the table and in flight (taken in index order;
//    nothing else takes two), so an open's place .. record steps and an
//    event of its exporter never interleave. An open stays listed in
//    flight from before its fetch until it ends, after its record (having
//    taken its log, it is sent no more events: the follow thread waits for
//    its placement lock and finds the record).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "common/fork_lock.h"
#include "core/import/ahead.h"
#include "core/import/import_follow.h"
#include "ledger/handle_codec.h"
#include "ledger/import_table.h"
#include "ledger/import_zone.h"
#include "ledger/in_flight_opens.h"
#include "ledger/zone_anchor_table.h"
#include "transport/client/fetch_client.h"

namespace vmmipc::core {

class ImportSide {
 public:
  // The same handle opened again: one more open of its pointer (an open made
  // ahead is adopted; ledger::ImportTable::Reopen).
  std::optional<uint64_t> Reopen(const ledger::OpenKey& key, ledger::Reopener* who);
  // After an open's fetch, under its run's placement lock, in one hold of the
  // import lock: the pointer when another thread opened the same handle
  // meanwhile; else nullopt and the follow events that came for the open in
  // flight `in_flight` (from BeginOpen; 0: none), `*overflowed` when more came
  // than its log holds. Takes the open's log either way (it stays listed
  // in flight until EndOpen: ledger::InFlightOpens::TakeLog).
  std::optional<uint64_t> ReopenOrEndOpen(const ledger::OpenKey& key, ledger::Reopener* who,
                                          uint64_t in_flight,
                                          std::vector<ledger::FollowEvent>* missed,
                                          bool* overflowed);

  // The chunks one open maps, and the targets its record holds.
  struct RunPlan {
    std::vector<ledger::MappedChunk> mapped_now;  // not mapped here yet: this open maps them
    std::vector<int> fd_to_map;                   // per mapped_now; -1: paused, nothing to map
    std::vector<uint64_t> targets;                // every chunk of the run, ascending
  };
  enum class Claim {
    kPlanned,    // `plan` says what to map
    kCollision,  // the zone slot serves another exporter (`owner`)
    kOccupied,   // the run's range in the slot holds other memory (a stale chunk, say)
    kOtherRun,   // an open of another run of the exporter returned `pointer`
  };
  struct ClaimResult {
    Claim claim = Claim::kPlanned;
    ledger::ExporterId owner;
    bool repeat = false;  // the collision of this (slot, exporter) was reported before
  };
  // Decides, in one hold of the import lock, whether `run` can go to `target`
  // in zone slot `slot` (kNotInZone: a reservation of the open's own, no slot
  // to check), and plans it: chunks already mapped there (an earlier open of
  // the same memory) are shared, reference counted. Caller holds the slot's
  // placement lock.
  ClaimResult ClaimRun(uint32_t slot, const ledger::ExporterId& exporter, uint64_t target,
                       uint64_t pointer, const std::vector<ledger::FetchedChunk>& run,
                       int32_t device, RunPlan* plan);
  // For a close: false when nothing is open here (the pointer is the driver's);
  // else the key of the open that returned `pointer`, if one did.
  bool KeyToClose(uint64_t pointer, std::optional<ledger::OpenKey>* key);
  // Records a mapped open: its newly mapped chunks, then the open itself
  // (false: a run mapped ahead found it open already; nothing recorded).
  bool AddOpen(const std::vector<ledger::MappedChunk>& mapped, ledger::OpenRecord record);
  // One close of `pointer` (ledger::ImportTable::Close).
  ledger::CloseResult Close(uint64_t pointer);
  // Ahead (ledger::ImportTable::DropAhead, DropAheadKey, AheadOf,
  // FirstSlotOf). The caller holds the placement locks of what it drops,
  // and unmaps.
  ledger::CloseResult DropAhead(const ledger::ExporterId& exporter, uint64_t base, bool all);
  ledger::CloseResult DropAheadKey(const ledger::OpenKey& key);
  ledger::AheadUse AheadOf(const ledger::ExporterId& exporter);
  std::optional<uint32_t> FirstSlotOf(const ledger::ExporterId& exporter);
  // The announced handles waiting to be mapped ahead, and the worker that
  // maps them (core/import/ahead.h).
  AheadWorker& ahead() { return ahead_; }
  // The imported run holding `address`, for the range queries; false when
  // vmmipc did not map it.
  bool RunAt(uint64_t address, uint64_t* base, uint64_t* size);
  // Follow (ledger::ImportTable): pause, the paused chunks at an exporter's
  // address, resume, and the rank slot of an exporter's opens.
  std::vector<ledger::MappedChunk> Pause(const ledger::ExporterId& exporter, uint64_t base,
                                         uint32_t generation);
  std::vector<ledger::MappedChunk> PausedAt(const ledger::ExporterId& exporter, uint64_t base);
  std::vector<ledger::MappedChunk> PauseAll(const ledger::ExporterId& exporter);
  void Resume(uint64_t target, uint32_t generation);
  // The placement locks (indexes, ascending, distinct) of every open of
  // `exporter`, recorded or in flight; empty when it has none here.
  std::vector<size_t> PlacementIndexesOf(const ledger::ExporterId& exporter);

  // Follow: an open of `exporter` in flight (ledger::InFlightOpens).
  uint64_t BeginOpen(const ledger::ExporterId& exporter, size_t placement_index);
  std::vector<ledger::FollowEvent> EndOpen(uint64_t id, bool* overflowed);
  // Logs `event` for the opens of `exporter` in flight; false when none is.
  bool LogForOpensInFlight(const ledger::ExporterId& exporter, const ledger::FollowEvent& event);

  // The placement lock of a handle: its rank slot, or its exporter's pid
  // when the exporter has no rank (rank_slot is ledger::kUnranked).
  static size_t PlacementIndex(uint32_t rank_slot, uint32_t exporter_pid) {
    const uint32_t key = rank_slot != ledger::kUnranked ? rank_slot : exporter_pid;
    return key % kPlacementLocks;
  }
  std::mutex& placement_mutex(uint32_t rank_slot, uint32_t exporter_pid) {
    return placement_mutexes_[PlacementIndex(rank_slot, exporter_pid)];
  }
  std::mutex& placement_mutex_at(size_t index) { return placement_mutexes_[index]; }

  // The import zone: reserved by `reserve()` on the first call, nullopt when
  // that failed (then every import is placed best-effort). Fixed from then on.
  using ReserveZone = std::optional<ledger::ZoneLayout> (*)();
  std::optional<ledger::ZoneLayout> Zone(ReserveZone reserve);
  // The zone if it is reserved; never reserves it.
  std::optional<ledger::ZoneLayout> ReservedZone();

  // Runs `use(table, anchors)` under the import lock (no driver call, no I/O).
  template <typename Use>
  auto WithAnchors(Use use) {
    std::lock_guard<std::mutex> lock(import_mutex_);
    return use(imports_, anchors_);
  }
  // The memory every anchor of `device` maps: made by `make(device, &memory)`
  // on the first call for the device (a driver call, under the anchor memory
  // lock); nullopt when that failed, which is not tried again.
  struct AnchorMemory {
    unsigned long long handle = 0;  // CUmemGenericAllocationHandle
    uint64_t size = 0;
  };
  template <typename Make>
  std::optional<AnchorMemory> AnchorMemoryFor(int32_t device, Make make) {
    std::lock_guard<std::mutex> lock(anchor_memory_mutex_);
    auto it = anchor_memory_.find(device);
    if (it == anchor_memory_.end()) {
      AnchorMemory memory;
      it = anchor_memory_
               .emplace(device, make(device, &memory) ? std::optional(memory) : std::nullopt)
               .first;
    }
    return it->second;
  }

  // Follow's part of the import side: the follower id and the watch
  // connections (core/import/import_follow.h, its own lock).
  ImportFollow& follow() { return follow_; }
  const ImportFollow& follow() const { return follow_; }

 private:
  static constexpr size_t kPlacementLocks = 64;

  // Runs `use(table)` under the import lock and returns what it returns: the
  // body of each method above that reads or writes the table. `use` makes no
  // driver call and no socket I/O.
  template <typename Use>
  auto WithTable(Use use) {
    std::lock_guard<std::mutex> lock(import_mutex_);
    return use(imports_);
  }
  enum class ZoneState { kUntried, kReserved, kUnavailable };

  std::mutex import_mutex_;
  ledger::ImportTable imports_;
  ledger::ZoneAnchorTable anchors_;

  std::mutex anchor_memory_mutex_;
  std::map<int32_t, std::optional<AnchorMemory>> anchor_memory_;

  std::mutex placement_mutexes_[kPlacementLocks];

  std::mutex zone_mutex_;
  ledger::ZoneLayout zone_;
  ZoneState zone_state_ = ZoneState::kUntried;

  ledger::InFlightOpens in_flight_;  // under import_mutex_

  AheadWorker ahead_;  // before follow_: the follow thread queues here until it stops
  ImportFollow follow_;
};

// This process's import side; makes the process state (core/process_state.cc)
// on the first call.
ImportSide& Importer();

}  // namespace vmmipc::core
