// One cuIpcOpenMemHandle of a VMM2 handle as named steps over one struct:
// decode (the handle and the call's arguments), fetch (the run's chunks and
// their fds from the exporter), catch up (what the exporter paused and resumed
// meanwhile: follow), place (where the run goes), map, record. Each step fills
// in its part of `Opening` and returns what the open returns when it ends the
// open there. core/import/ipc_import.cc runs them in that order; the locks
// each step takes are said at the step.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "core/import/import_side.h"
#include "ledger/handle_codec.h"
#include "ledger/import_table.h"
#include "ledger/in_flight_opens.h"
#include "transport/client/fetch_client.h"

namespace vmmipc::core {

class FollowedOpen;

// Where a run goes: its zone slot, or a private reservation of its own.
struct Placement {
  uint64_t run_target = 0;                  // importer address of the run's first byte
  uint32_t zone_slot = ledger::kNotInZone;  // the slot it went to, if in the zone
  uint64_t private_reservation = 0;         // non-zero for best-effort placement
  uint64_t private_size = 0;
};

struct Opening {
  // The state this open advances its run to (ledger::RunState): kOpened for
  // the application's open, kMappedAhead for the ahead worker's
  // (core/import/ahead.cc), whose run goes only where the application's open
  // would put it and stays unreturned until that open adopts it.
  ledger::RunState advances_to = ledger::RunState::kOpened;
  bool ahead() const { return advances_to == ledger::RunState::kMappedAhead; }
  // decode
  ledger::Vmm2Handle handle;
  ledger::OpenKey key;
  ledger::Reopener reopener;  // who reopens, and whether it adopted an open made ahead
  CUdevice device = 0;
  uint64_t opened_address = 0;  // the exporter address whose image the open returns
  // fetch
  transport::FetchResult fetched;  // the run, each chunk with its fd
  int64_t fetch_us = 0;
  // catch up: the run as it will be mapped (generations after the exporter's
  // pauses and resumes during the fetch, paused chunks without an fd)
  std::vector<ledger::FetchedChunk> run;
  // place
  Placement placement;
  ImportSide::RunPlan plan;  // the chunks this open maps, and the record's
  int64_t place_us = 0;
  // map
  SteadyClock::time_point map_start;
  int64_t import_and_map_us = 0;

  uint64_t run_base() const { return run.front().address; }
  uint64_t run_size() const { return run.back().address + run.back().size - run_base(); }
  // The importer address of `opened_address`: the handle's address, or its
  // chunk's start for an interior handle (core/import/interior_handles.h).
  uint64_t pointer() const { return placement.run_target + (opened_address - run_base()); }
};

// The open's warnings, one or two per call, are rate-limited: an
// application may retry a failing open in a loop (455,000 lines in 8 s
// before), or open and close in one. What the open returns does not change;
// VMMIPC_STATS counts every failure by cause.
log::LineLimit& OpenLines();
template <typename... Args>
void OpenWarning(log::Level level, fmt::format_string<Args...> format, Args&&... args) {
  log::LogLimited(OpenLines(), level, "cuIpcOpenMemHandle", "warnings", format,
                  std::forward<Args>(args)...);
}

// decode: the handle, the flags, not our own handle, a current context. A
// handle that is not VMM2 (or fails its checksum) goes to the real driver.
// nullopt: go on; else what the open returns. No lock.
std::optional<CUresult> DecodeOpen(CUdeviceptr* pointer, const CUipcMemHandle& raw,
                                   unsigned int flags, bool v2, Opening* open);

// fetch: the run from the exporter, checked to start at the handle's chunk
// and to be contiguous. Holds no lock: a stopped or slow exporter delays only
// the opens of its own handles, each bounded by VMMIPC_TIMEOUT_MS.
CUresult FetchRun(FollowedOpen& followed, Opening* open);

// place: the run's zone slot when the exporter is ranked, the slot serves no
// other exporter, the run fits it and nothing else is mapped there (a stale
// chunk of an earlier generation counts as something else: never aliased);
// else a private reservation (best-effort, one line why). Plans the chunks to
// map in the same hold of the import lock. Caller holds the run's placement
// lock.
CUresult PlaceRun(ImportSide& importer, Opening* open);

// map: the planned chunks (a paused one waits for its resume), with access
// for the open's device, one cuMemSetAccess per contiguous stretch; a
// page-table anchor in the way moves first. On failure nothing of them stays
// mapped and a private reservation is freed. Caller holds the placement lock.
CUresult MapRun(ImportSide& importer, Opening* open);

// record: the open in the import table, its stats, the watch connection the
// fetch brought (follow), and its debug line. Caller holds the placement lock.
void RecordOpen(ImportSide& importer, Opening* open);

// Every step after decode, in order (core/import/ipc_import.cc): the
// application's open and the ahead worker's alike. Takes the
// placement lock itself.
CUresult OpenDecoded(ImportSide& importer, Opening* open, CUdeviceptr* pointer);

// Ahead: advances the announced `handle`'s run to mapped, ahead of the
// application, on the ahead worker (core/import/ahead.h). Never throws;
// failures are counted and said at debug level (the application's own open
// then does it).
void MapAhead(const AheadWorker::Handle& handle) noexcept;

}  // namespace vmmipc::core
