// ImportTable: what this process has imported from its peers. Two tables:
//  - chunks: every peer chunk mapped here, by importer address, with the
//    number of open records that use it;
//  - opens: one record per imported run, in the state it has reached
//    (RunState): mapped ahead of the application (VMMIPC_AHEAD), or opened,
//    with its open count and the chunks it holds. The application's first
//    open of a handle mapped ahead adopts its record.
// Each open is matched by exactly one close, and the last close of the last
// user of a chunk hands it back for unmapping (the seed design leaked here).
// It also knows which exporter each rank slot of the zone serves: the first
// placed there, for as long as it has opens there, so that two exporters
// that claim one slot (two processes on one GPU without a rank variable)
// never share its addresses.
// Pure bookkeeping: core does the driver calls. Not thread-safe: core locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace vmmipc::ledger {

// An exporter process: its pid and the public instance id in its handles
// (a later process with the same pid has another).
struct ExporterId {
  uint32_t pid = 0;
  uint64_t instance = 0;
  bool operator==(const ExporterId&) const = default;
  auto operator<=>(const ExporterId&) const = default;
};

// A peer chunk mapped in this process.
struct MappedChunk {
  uint64_t target = 0;  // importer address
  uint64_t size = 0;
  ExporterId exporter;
  uint64_t exporter_address = 0;  // the chunk's base in the exporter
  uint32_t generation = 0;
  uint32_t users = 0;   // open records holding it
  int32_t device = -1;  // the importer's device the mapping was opened for (access)
  // Follow: the exporter paused it and the mapping is gone; the range stays
  // reserved (the zone slot or the open's reservation) for its resume.
  bool paused = false;
};

// Identity of one handle: the same handle opened again is the same key.
struct OpenKey {
  ExporterId exporter;
  uint64_t address = 0;
  uint32_t generation = 0;
  uint64_t region_base = 0;
  uint32_t rank_slot = 0;
  auto operator<=>(const OpenKey&) const = default;
};

inline constexpr uint32_t kNotInZone = 0xFFFFFFFFu;

// How far an imported run has come. A handle the exporter announced
// (VMMIPC_AHEAD) waits in the ahead worker's queue (core/import/ahead.h);
// the worker advances it to kMappedAhead (fetched, imported, mapped, access
// set, at the address the application's open would return); the
// application's open advances a run to kOpened, from nothing or by adopting
// a kMappedAhead record. Either state's chunks may be paused by their
// exporter (MappedChunk::paused) and resumed; a record is dropped by its
// last close (kOpened), or by its exporter's pause or free, or the end of
// its follow (kMappedAhead: never the application's to close).
enum class RunState : uint8_t {
  kMappedAhead,
  kOpened,
};
// "mapped ahead", "opened": for log lines.
inline const char* RunStateName(RunState state) {
  return state == RunState::kMappedAhead ? "mapped ahead" : "opened";
}

struct OpenRecord {
  uint64_t pointer = 0;             // what cuIpcOpenMemHandle returned
  uint32_t zone_slot = kNotInZone;  // the zone slot its run was placed in
  OpenKey key;
  uint32_t opens = 0;            // outstanding opens of this pointer
  std::vector<uint64_t> chunks;  // targets of the chunks it holds, ascending
  uint64_t run_base = 0;         // importer range of the whole mapped run
  uint64_t run_size = 0;
  uint64_t private_reservation = 0;  // best-effort placement: its own reservation
  uint64_t private_reservation_size = 0;
  // Other handles that opened this same run at this same pointer: after a
  // followed resume, a handle of the new memory lands where the old one is.
  std::vector<OpenKey> alias_keys;
  RunState state = RunState::kOpened;
  // The exporter address `pointer` stands for: the handle's address, or its
  // chunk's start for an interior handle (core/import/interior_handles.h).
  uint64_t opened_address = 0;
  int32_t device = -1;  // the device its access was set for
};

// Who reopens a handle, and what the reopen found.
struct Reopener {
  RunState advances_to = RunState::kOpened;  // kMappedAhead: the worker; a record is left as it is
  int32_t device = -1;                       // the application's device (adopting needs the same)
  // The exporter address the application's open returns the image of (its
  // interior rule, decided now): a record mapped ahead for another one is
  // moved to that pointer when adopted.
  uint64_t opened_address = 0;
  // out
  bool adopted = false;   // the application took over a record mapped ahead
  bool reopened = false;  // one more open of a record the application opened
  // A record mapped ahead is in the way: made for another device, or its
  // pointer cannot move where this open's goes. The caller drops it and
  // opens afresh.
  bool in_the_way = false;
};

// The opens made ahead of one exporter: their chunks and bytes.
struct AheadUse {
  size_t chunks = 0;
  uint64_t bytes = 0;
};

enum class PointerUse {
  kFree,      // no open returned this pointer
  kSameRun,   // an open returned it for exactly this run: the new open joins it
  kOtherRun,  // an open returned it for another run
};

enum class ChunkProbe {
  kFree,      // nothing mapped over [target, target + size)
  kSame,      // exactly this exporter chunk is already mapped there
  kConflict,  // something else overlaps (another chunk, or a stale generation)
};

// What a close hands back to core for driver calls.
struct CloseResult {
  bool ours = false;                  // false: not opened by vmmipc, pass through
  bool last = false;                  // the record is gone
  std::vector<MappedChunk> to_unmap;  // chunks with no users left
  uint64_t free_reservation = 0;      // a private reservation to free
  uint64_t free_reservation_size = 0;
};

class ImportTable {
 public:
  // Opening the same handle again: bump and return its pointer. A record
  // mapped ahead is adopted instead (no bump) by the application's open on
  // the same device, at the pointer of the application's own opened address
  // (the record moves there when that differs and is free); the worker
  // bumps nothing (the handle is mapped already). Without `who`: the
  // application's, on the device and opened address of any record mapped ahead.
  std::optional<uint64_t> Reopen(const OpenKey& key, Reopener* who = nullptr);
  ChunkProbe Probe(uint64_t target, uint64_t size, const ExporterId& exporter,
                   uint64_t exporter_address, uint32_t generation) const;
  // Records a newly mapped chunk with no users yet.
  void AddChunk(const MappedChunk& chunk);
  // Whether `pointer` was returned by an open, and for which run.
  PointerUse UseOf(uint64_t pointer, uint64_t run_base, uint64_t run_size) const;
  // Records an open whose chunks (all already added) it starts using. When an
  // open of the same run returned the same pointer (PointerUse::kSameRun),
  // the new key joins that record as one more open of it (an application's
  // open adopts a record mapped ahead; one mapped ahead joins nothing). False
  // when a run mapped ahead joined nothing.
  bool AddOpen(OpenRecord record);
  // One close of `pointer` (not of an open made ahead: not the application's).
  CloseResult Close(uint64_t pointer);
  // Ahead: the records mapped ahead of `exporter` and not adopted that hold
  // its chunk at `exporter_address` (`all`: every one of `exporter`), taken
  // out as their last close; what they alone held is returned to unmap.
  CloseResult DropAhead(const ExporterId& exporter, uint64_t exporter_address, bool all);
  // The record mapped ahead that `key` names, taken out (Reopener::in_the_way).
  CloseResult DropAheadKey(const OpenKey& key);
  AheadUse AheadOf(const ExporterId& exporter) const;
  // The zone slot where the application's first open of `exporter`'s memory
  // placed it (kOpened), kept for the exporter's life whatever it announces
  // since; nullopt before one, or when that open went best-effort.
  std::optional<uint32_t> FirstSlotOf(const ExporterId& exporter) const;
  // Chunks with no users, as left by a failed open: removes and returns them.
  std::vector<MappedChunk> TakeUnused(const std::vector<uint64_t>& targets);
  // The key of the handle `pointer` was opened from (core takes its
  // placement lock for the close); nullopt when no open returned `pointer`.
  std::optional<OpenKey> KeyOf(uint64_t pointer) const;
  // The open record whose run contains `address`, for the range queries.
  const OpenRecord* FindByAddress(uint64_t address) const;
  // The exporter that zone slot `slot` serves (it has opens placed there);
  // nullopt when the slot is free.
  std::optional<ExporterId> SlotOwner(uint32_t slot) const;
  // True the first time `exporter` is turned away from `slot`: the warning
  // is said once per pair. By exporter, not pid: two containers' exporters
  // can share one pid, and each is worth its warning.
  bool FirstCollision(uint32_t slot, const ExporterId& exporter);

  // Follow. The chunks of `exporter` at its address `exporter_address` and
  // `generation` that are mapped: marked paused and returned (core unmaps them).
  std::vector<MappedChunk> Pause(const ExporterId& exporter, uint64_t exporter_address,
                                 uint32_t generation);
  // Every mapped chunk of `exporter`, marked paused and returned (it no
  // longer follows that exporter: core unmaps them).
  std::vector<MappedChunk> PauseAll(const ExporterId& exporter);
  // The paused chunks of `exporter` at its address `exporter_address`.
  std::vector<MappedChunk> PausedAt(const ExporterId& exporter, uint64_t exporter_address) const;
  // The paused chunk at importer address `target` is mapped again, as `generation`.
  void Resume(uint64_t target, uint32_t generation);
  // The rank slots the opens of `exporter` were made under (their placement
  // locks), each once; empty when none is open.
  std::vector<uint32_t> RankSlotsOf(const ExporterId& exporter) const;

  // Every chunk (paused or not) that overlaps [begin, end), ascending.
  std::vector<MappedChunk> ChunksIn(uint64_t begin, uint64_t end) const;

  size_t chunk_count() const { return chunks_.size(); }
  size_t open_count() const { return opens_.size(); }

 private:
  std::map<uint64_t, MappedChunk> chunks_;  // by target
  // The last close of the record at `it`, into `result`.
  void Remove(std::map<uint64_t, OpenRecord>::iterator it, CloseResult* result);

  std::map<uint64_t, OpenRecord> opens_;  // by pointer
  std::map<OpenKey, uint64_t> by_key_;
  struct SlotUse {
    ExporterId exporter;
    size_t opens = 0;  // open records placed in the slot
  };
  std::map<uint32_t, SlotUse> slots_;
  std::set<std::pair<uint32_t, ExporterId>> collisions_warned_;  // (slot, exporter)
  std::map<ExporterId, uint32_t> first_slots_;  // FirstSlotOf: one entry per exporter opened
};

}  // namespace vmmipc::ledger
