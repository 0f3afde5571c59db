// ProcessState: everything vmmipc knows about this process, created on first
// use (never at load time) and never destroyed (hooks can run during exit).
// A forked child gets a fresh one: new secret, no listener, no imports, since
// the parent's threads, sockets and GPU mappings do not carry over.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "state/arena_carver.h"
#include "state/chunk_generations.h"
#include "state/handle_codec.h"
#include "state/import_table.h"
#include "state/import_zone.h"
#include "state/vmm_mappings.h"
#include "transport/listener.h"
#include "transport/watch_client.h"

namespace vmmipc::core {

enum class ZoneState { kUntried, kReserved, kUnavailable };
enum class ArenaState { kUntried, kReserved, kUnavailable };

struct ProcessState {
  uint32_t pid = 0;
  // Handles are capabilities made under `secret`, which never leaves the
  // process (transport/wire.h Capability); `instance` is public, in every
  // handle, and tells this process from an earlier one with the same pid.
  transport::SipKey secret;
  uint32_t instance = 0;  // never 0
  int32_t rank = -1;      // this process's slot from a rank variable, -1 none

  // Slots found from the GPU for a process without a rank variable, per
  // device ordinal (core/rank_slot.h): 0 not asked yet, -1 none, else slot+1.
  // Each is written once, under gpu_slot_mutex, then only read.
  static constexpr int kMaxSlotDevices = 64;
  std::atomic<int32_t> gpu_slots[kMaxSlotDevices] = {};
  std::mutex gpu_slot_mutex;
  bool gpu_slot_tagged = false;  // the log tag names a slot from the GPU; under gpu_slot_mutex

  // Export side. `generations` and `mappings` lock themselves (mappings also
  // holds the exported-fd cache). export_mutex guards the members after them;
  // get takes it only until the listener has started, and export_context is
  // written before the listener's threads start, read-only after.
  state::ChunkGenerations generations;
  state::VmmMappings mappings;  // own VMM mappings, from the cuMemMap/cuMemUnmap hooks
  std::mutex export_mutex;
  std::unique_ptr<transport::Listener> listener;
  std::atomic<bool> listener_ready{false};  // lets get skip export_mutex once started
  void* export_context = nullptr;  // CUcontext of the first export, for the listener thread
  bool listener_failed = false;
  // Chunks a get asked to export ahead of their first request (ipc_export.cc):
  // drained by one listener task at a time. Guarded by export_ahead_mutex,
  // which is held only to push or swap the list.
  std::mutex export_ahead_mutex;
  std::vector<uint64_t> export_ahead;
  bool export_ahead_queued = false;  // a drain task is posted and has not finished

  // Export arena: this process's own reservations, carved from one region.
  std::mutex arena_mutex;  // guards the members below
  ArenaState arena_state = ArenaState::kUntried;
  uint64_t arena_base = 0;
  std::unique_ptr<state::ArenaCarver> arena;
  bool arena_exhausted_warned = false;

  // Import side. The locking rule:
  //  - import_mutex guards `imports`. It is held only while the table is read
  //    or written: never across socket I/O or a driver call, so pointer
  //    queries and opens of other exporters never wait behind an open.
  //  - placement_mutex(key) serialises the placement and the driver calls
  //    (map, set access, unmap) of the opens and closes of one rank slot of
  //    the zone (or, for an unranked exporter, of one exporter), so that a
  //    chunk being unmapped by a close is never probed free and mapped over
  //    by an open, and two opens of one handle agree on one pointer. Opens
  //    of exporters in other slots run in parallel; fetching fds from the
  //    exporter happens before it is taken. Taken before import_mutex,
  //    never after it.
  //  - zone_mutex guards the zone's reservation; zone and zone_state never
  //    change once EnsureZone (placement.h) has returned.
  std::mutex import_mutex;
  state::ImportTable imports;
  static constexpr size_t kPlacementLocks = 64;
  std::mutex placement_mutexes[kPlacementLocks];
  // The lock of a handle's placement: its rank slot, or its exporter's pid
  // when the exporter has no rank (rank_slot is state::kUnranked).
  std::mutex& placement_mutex(uint32_t rank_slot, uint32_t exporter_pid) {
    const uint32_t key = rank_slot != state::kUnranked ? rank_slot : exporter_pid;
    return placement_mutexes[key % kPlacementLocks];
  }
  std::mutex zone_mutex;
  state::ZoneLayout zone;
  ZoneState zone_state = ZoneState::kUntried;

  // Follow, import side (core/follow.h): the watch client, made by the first
  // open that asks an exporter to be watched, under follow_mutex; never
  // destroyed. follow_context is the context its thread maps and sets access
  // in (the one current at that first open), written once before the client.
  std::mutex follow_mutex;
  std::unique_ptr<transport::WatchClient> watch_client;
  void* follow_context = nullptr;
};

// The process's state; creates it (and registers the fork handler) on first call.
ProcessState& State();

}  // namespace vmmipc::core
