// InFlightOpens: the opens of follow-enabled importers between the moment
// they ask the exporter for a run and the moment they record it, and the
// pause and resume events of that exporter that arrive meanwhile. An event
// can reach the importer's follow thread before the open that holds the
// chunk has placed it (the exporter granted the chunk, then paused it, while
// the open waited for its placement lock): such an event is logged for every
// open of that exporter in flight, and the open applies the log to the run
// it fetched before it maps anything (ApplyFollowEvents), so that it never
// maps memory a pause released and still hears of the resume.
// Pure bookkeeping; not thread-safe: core locks (import_side.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/scoped_fd.h"
#include "ledger/import_table.h"

namespace vmmipc::ledger {

struct FollowEvent {
  bool resume = false;  // false: a pause (or, with unfollowed, neither)
  uint64_t base = 0;    // the chunk's base in the exporter
  uint64_t size = 0;
  uint32_t generation = 0;       // pause: the one released; resume: the new one
  std::shared_ptr<ScopedFd> fd;  // resume: the new memory (shared by the opens it was logged for)
  bool unfollowed = false;       // the exporter no longer follows this process: map nothing of it
};

// One chunk of a fetched run, as the open will place it.
struct FetchedChunk {
  uint64_t address = 0;  // in the exporter
  uint64_t size = 0;
  uint32_t generation = 0;
  int fd = -1;           // what to map (borrowed: the grant's, or a resume's)
  bool paused = false;   // released by a pause since it was granted: nothing to map
  bool refused = false;  // resumed with another size: stays unmapped (logged by core)
  std::shared_ptr<ScopedFd> resumed_fd;  // keeps a resume's fd alive while fd points at it
};

class InFlightOpens {
 public:
  // At most this many events are logged for one open; past it the open fails.
  static constexpr size_t kMaxEvents = 4096;

  // An open of `exporter`'s handle under placement lock `lock_index` starts.
  uint64_t Begin(const ExporterId& exporter, size_t lock_index);
  // The open takes its log, and whether it overflowed, under its placement
  // lock before it places: it stays listed (LockIndexes) until End, but
  // logs nothing more. An event after this is handled on the table, under
  // that placement lock, once the open recorded what it mapped (before, an
  // event that came between the two found neither the open nor its record,
  // and was acked as not held while the open went on to map the memory).
  std::vector<FollowEvent> TakeLog(uint64_t id, bool* overflowed);
  // The open ends (recorded, or failed): its log if it did not take it.
  std::vector<FollowEvent> End(uint64_t id, bool* overflowed);
  // Logs `event` for every open of `exporter` in flight that has not taken
  // its log; false when none has.
  bool Log(const ExporterId& exporter, const FollowEvent& event);
  // The placement locks of the opens of `exporter` in flight.
  std::vector<size_t> LockIndexes(const ExporterId& exporter) const;
  size_t size() const { return opens_.size(); }

 private:
  struct Open {
    ExporterId exporter;
    size_t lock_index = 0;
    std::vector<FollowEvent> events;
    bool overflowed = false;
    bool placing = false;  // took its log: placing, mapping, recording
  };
  std::map<uint64_t, Open> opens_;
  uint64_t next_id_ = 1;
};

// Applies `events`, in the order they arrived, to the run an open fetched: a
// pause of a chunk's generation marks it paused; a later resume at its base
// maps the new memory instead (same size) or leaves it unmapped (refused).
// Unfollowed events are not applied: the open checks for them first
// (AnyUnfollowed) and maps nothing, as what it holds of that exporter has
// just been dropped.
void ApplyFollowEvents(const std::vector<FollowEvent>& events, std::vector<FetchedChunk>* run);
bool AnyUnfollowed(const std::vector<FollowEvent>& events);

}  // namespace vmmipc::ledger
