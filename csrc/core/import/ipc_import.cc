// The importer's side: cuIpcOpenMemHandle of a VMM2 handle (fetch the run's
// chunk fds from the exporter, map them at deterministic addresses) and
// cuIpcCloseMemHandle (the last close unmaps). Foreign handles and pointers
// go to the real driver unchanged.
#include <cinttypes>
#include <mutex>
#include <optional>

#include "common/elapsed.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "config/params.h"
#include "core/follow.h"
#include "core/hooks.h"
#include "core/import/placement.h"
#include "core/process_state.h"
#include "core/real.h"
#include "core/stats.h"
#include "core/import/zone_anchors.h"
#include "driver/status.h"
#include "state/handle_codec.h"
#include "transport/peer_client.h"

namespace vmmipc::core {
namespace {

// The open's warnings, one or two per call, are rate-limited: an
// application may retry a failing open in a loop (455,000 lines in 8 s
// before), or open and close in one (best-effort placement lines). What the
// open returns does not change; VMMIPC_STATS counts every failure by cause.
log::LineLimit g_open_lines;
log::LineLimit g_placement_lines;

template <typename... Args>
void OpenWarning(log::Level level, fmt::format_string<Args...> format, Args&&... args) {
  log::LogLimited(g_open_lines, level, "cuIpcOpenMemHandle", "warnings", format,
                  std::forward<Args>(args)...);
}

CUresult ForwardOpen(CUdeviceptr* pointer, const CUipcMemHandle& handle, unsigned int flags,
                     bool v2) {
  return v2 ? VMMIPC_REAL(IpcOpenMemHandle, pointer, handle, flags)
            : VMMIPC_REAL(IpcOpenMemHandleV1, pointer, handle, flags);
}

// What cuIpcOpenMemHandle returns for a failed fetch and for an exporter's
// refusal. The names and counters of both enums come from their lists
// (transport/peer_client.h, transport/chunk_grant.h); transport knows no
// CUresult, so these two switches are the one hand-written mapping. Every
// declared value is listed (no default) and a missing one fails the build.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
CUresult CodeForRefusal(transport::RefuseReason reason) {
  using transport::RefuseReason;
  switch (reason) {
    case RefuseReason::kBadToken:
    case RefuseReason::kFreed:
    case RefuseReason::kNotExported:
      return CUDA_ERROR_INVALID_HANDLE;  // the handle no longer names memory there
    case RefuseReason::kWrongUser:
      return CUDA_ERROR_NOT_PERMITTED;
    case RefuseReason::kNone:
    case RefuseReason::kExportFailed:
    case RefuseReason::kTooManyChunks:
    case RefuseReason::kInternal:
    case RefuseReason::kBadRequest:
      return CUDA_ERROR_MAP_FAILED;
  }
  return CUDA_ERROR_MAP_FAILED;  // a reason from the wire that this build does not declare
}

CUresult CodeForFetch(const transport::FetchResult& fetched) {
  using transport::FetchStatus;
  switch (fetched.status) {
    case FetchStatus::kOk:
      return CUDA_SUCCESS;
    case FetchStatus::kNoExporter:
      return CUDA_ERROR_INVALID_HANDLE;
    case FetchStatus::kUnauthentic:
      return CUDA_ERROR_NOT_PERMITTED;
    case FetchStatus::kNoResources:
      return CUDA_ERROR_OPERATING_SYSTEM;
    case FetchStatus::kTimeout:
    case FetchStatus::kProtocolError:
      return CUDA_ERROR_MAP_FAILED;
    case FetchStatus::kRefused:
      return CodeForRefusal(fetched.refuse);
  }
  return CUDA_ERROR_MAP_FAILED;
}
#pragma GCC diagnostic pop

CUresult FetchFailure(const transport::FetchResult& fetched, const state::Vmm2Handle& h) {
  stats::CountFetchFailure(fetched.status);
  const CUresult code = CodeForFetch(fetched);
  if (code == CUDA_SUCCESS) return code;
  OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle(pid {}, 0x{:x}): {}; returning {}", h.pid,
              h.address,
              fetched.detail.empty() ? transport::FetchStatusName(fetched.status) : fetched.detail,
              driver::ErrorName(code));
  return code;
}

// The exporter's answer must describe a run that starts at the handle's chunk
// and is contiguous; anything else is refused before mapping.
bool RunIsConsistent(const std::vector<transport::ChunkGrant>& chunks, const state::Vmm2Handle& h) {
  if (chunks.empty() || chunks[0].address != h.chunk_base || chunks[0].size != h.chunk_size)
    return false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].size == 0 || !chunks[i].fd.valid()) return false;
    if (chunks[i].address + chunks[i].size < chunks[i].address) return false;  // wraps
    if (i > 0 && chunks[i].address != chunks[i - 1].address + chunks[i - 1].size) return false;
  }
  return true;
}

// The same handle already open here: one more open of its pointer.
bool Reopened(ProcessState& state, const state::OpenKey& key, CUdeviceptr* pointer) {
  const std::optional<uint64_t> again = state.importer.Reopen(key);
  if (!again) return false;
  stats::Count(stats::Counter::kReopens);
  *pointer = *again;
  return true;
}

struct Placement {
  uint64_t run_target = 0;                 // importer address of the run's first byte
  uint32_t zone_slot = state::kNotInZone;  // the slot it went to, if in the zone
  uint64_t private_reservation = 0;        // non-zero for best-effort placement
  uint64_t private_size = 0;
};

// Decides where the run goes: its slot in the zone when the exporter is
// ranked, the slot serves no other exporter, the run fits the slot, and
// nothing else is mapped there (a stale chunk of an earlier generation counts
// as something else: never aliased). Caller holds the handle's placement lock.
CUresult PlaceRun(ProcessState& state, const state::Vmm2Handle& h,
                  const std::vector<transport::ChunkGrant>& chunks, Placement* placement) {
  const uint64_t run_base = chunks.front().address;
  const uint64_t run_size = chunks.back().address + chunks.back().size - run_base;
  const state::ExporterId exporter{h.pid, h.instance};
  const char* why_not = nullptr;
  bool repeat_collision = false;  // said once per (slot, pid): later ones are debug lines
  std::string collision;
  if (h.rank_slot == state::kUnranked) {
    why_not = "the exporter has no rank slot (no rank variable, and none from its GPU)";
  } else {
    const std::optional<state::ZoneLayout> zone = ImportZone(state.importer);
    std::optional<uint64_t> target;
    if (zone) target = state::ZoneTarget(*zone, h.rank_slot, h.region_base, run_base, run_size);
    if (!zone) {
      why_not = "there is no import zone";
    } else if (!target) {
      why_not =
          "the run does not fit the exporter's slot (rank >= VMMIPC_ZONE_SLOTS, or "
          "offset beyond VMMIPC_SLOT_SIZE)";
    } else {
      state.importer.WithTable([&](state::ImportTable& imports) {
        if (std::optional<state::ExporterId> owner = imports.SlotOwner(h.rank_slot);
            owner && *owner != exporter) {
          stats::Count(stats::Counter::kSlotCollisions);
          repeat_collision = !imports.FirstCollision(h.rank_slot, h.pid);
          collision = fmt::format(
              "rank slot {} already serves pid {}, and pid {} claims it too (two processes on "
              "one GPU without a rank variable, or the same rank twice); set VMMIPC_RANK (or "
              "LOCAL_RANK) to a different value in each process",
              h.rank_slot, owner->pid, h.pid);
          why_not = collision.c_str();
          return;
        }
        for (const transport::ChunkGrant& chunk : chunks) {
          const uint64_t chunk_target = *target + (chunk.address - run_base);
          if (imports.Probe(chunk_target, chunk.size, exporter, chunk.address,
                            static_cast<uint32_t>(chunk.generation)) ==
              state::ChunkProbe::kConflict) {
            why_not =
                "its slot range already holds other memory (a stale chunk the exporter "
                "re-created, or another reservation of the exporter at the same offset)";
            return;
          }
        }
      });
      if (why_not == nullptr) {
        placement->run_target = *target;
        placement->zone_slot = h.rank_slot;
        return CUDA_SUCCESS;
      }
    }
  }
  if (repeat_collision)
    VMMIPC_LOG_DEBUG("placing {} from pid {} best-effort: {}", log::Bytes(run_size), h.pid,
                     why_not);
  else if (h.rank_slot == state::kUnranked)
    log::LogLimited(g_placement_lines, log::Level::kInfo, "placement", "best-effort placements",
                    "placing {} from pid {} best-effort: {}", log::Bytes(run_size), h.pid, why_not);
  else
    log::LogLimited(g_placement_lines, log::Level::kWarn, "placement", "best-effort placements",
                    "placing {} from pid {} (rank {}) best-effort, not at a "
                    "deterministic address: {}",
                    log::Bytes(run_size), h.pid, h.rank_slot, why_not);
  stats::Count(stats::Counter::kPlacementsBestEffort);
  VMMIPC_RETURN_IF_ERROR(ReserveAnywhere(run_size, &placement->private_reservation));
  placement->private_size = run_size;
  placement->run_target = placement->private_reservation;
  return CUDA_SUCCESS;
}

// Follow's part in one open (VMMIPC_FOLLOW=1): the watch connection it may
// ask for, and its place among the opens in flight, from before the fetch
// until it takes the events that arrived meanwhile, under its placement lock
// (state/in_flight_opens.h). Both end on every path.
class FollowedOpen {
 public:
  FollowedOpen(ProcessState& state, const state::Vmm2Handle& h)
      : state_(state), exporter_{h.pid, h.instance}, follower_(FollowerId(state)) {
    if (follower_ == 0) return;
    watch_ = StartWatch(state, h.pid, h.instance);
    in_flight_ =
        state.importer.BeginOpen(exporter_, ImportSide::PlacementIndex(h.rank_slot, h.pid));
  }
  ~FollowedOpen() {
    bool overflowed = false;
    if (in_flight_ != 0) state_.importer.EndOpen(in_flight_, &overflowed);
    if (watch_) EndWatch(state_, exporter_.pid, static_cast<uint32_t>(exporter_.instance));
  }
  FollowedOpen(const FollowedOpen&) = delete;
  FollowedOpen& operator=(const FollowedOpen&) = delete;

  uint32_t follower() const { return follower_; }
  bool watch() const { return watch_; }
  // Under the placement lock: the pauses and resumes of the exporter since
  // the fetch began. False when more arrived than the log holds.
  bool TakeMissed(std::vector<state::FollowEvent>* missed) {
    if (in_flight_ == 0) return true;
    bool overflowed = false;
    *missed = state_.importer.EndOpen(in_flight_, &overflowed);
    in_flight_ = 0;
    return !overflowed;
  }

 private:
  ProcessState& state_;
  state::ExporterId exporter_;
  uint32_t follower_ = 0;
  bool watch_ = false;
  uint64_t in_flight_ = 0;
};

// The fetched run as the open will place it, after what its exporter paused
// and resumed while it was fetched: generations and fds updated in `chunks`
// too, so that placement probes what will really be mapped.
std::vector<state::FetchedChunk> ApplyMissed(const std::vector<state::FollowEvent>& missed,
                                             std::vector<transport::ChunkGrant>* chunks,
                                             const state::Vmm2Handle& h) {
  std::vector<state::FetchedChunk> run;
  for (const transport::ChunkGrant& grant : *chunks)
    run.push_back({grant.address, grant.size, static_cast<uint32_t>(grant.generation),
                   grant.fd.get(), false, false, nullptr});
  if (missed.empty()) return run;
  state::ApplyFollowEvents(missed, &run);
  for (size_t i = 0; i < run.size(); ++i) {
    (*chunks)[i].generation = run[i].generation;
    if (run[i].paused) stats::Count(stats::Counter::kFollowPauses);
    if (run[i].refused) {
      stats::Count(stats::Counter::kFollowResumeRefused);
      OpenWarning(
          log::Level::kWarn,
          "follow: pid {} resumed 0x{:x} with other memory while it was being opened here; not "
          "mapped: the range stays unmapped until it is closed",
          h.pid, run[i].address);
    }
  }
  VMMIPC_LOG_DEBUG("follow: pid {} paused or resumed {} time(s) while 0x{:x} was opened here",
                   h.pid, missed.size(), h.address);
  return run;
}

// Maps the chunks an open brings (those with an fd: a paused one waits for
// its resume) and opens access to them, one cuMemSetAccess per contiguous
// stretch. On failure nothing of them stays mapped and a private reservation
// is freed. `*import_and_map_us`: the time until the last map, from `map_start`.
CUresult MapNewChunks(ProcessState& state, const Placement& placement,
                      const std::vector<state::MappedChunk>& mapped_now,
                      const std::vector<int>& fd_to_map, CUdevice device,
                      SteadyClock::time_point map_start, uint64_t* import_and_map_us) {
  CUresult result = CUDA_SUCCESS;
  // A page-table anchor where a chunk goes moves out of the way first.
  if (placement.zone_slot != state::kNotInZone &&
      !ClearAnchorsFor(state.importer, placement.zone_slot, mapped_now))
    result = CUDA_ERROR_MAP_FAILED;
  size_t mapped_count = 0;
  for (; result == CUDA_SUCCESS && mapped_count < mapped_now.size(); ++mapped_count) {
    if (fd_to_map[mapped_count] < 0) continue;  // paused by its exporter: the range waits
    result = MapChunk(fd_to_map[mapped_count], mapped_now[mapped_count].target,
                      mapped_now[mapped_count].size);
    if (result != CUDA_SUCCESS) break;
  }
  *import_and_map_us = MicrosSince(map_start);
  // One cuMemSetAccess per contiguous stretch of new chunks.
  for (size_t i = 0; result == CUDA_SUCCESS && i < mapped_now.size();) {
    if (fd_to_map[i] < 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < mapped_now.size() && fd_to_map[j] >= 0 &&
           mapped_now[j].target == mapped_now[j - 1].target + mapped_now[j - 1].size)
      ++j;
    const uint64_t end = mapped_now[j - 1].target + mapped_now[j - 1].size;
    result = OpenAccess(mapped_now[i].target, end - mapped_now[i].target, device);
    i = j;
  }
  if (result != CUDA_SUCCESS) {
    stats::Count(stats::Counter::kOpenFailedMap);
    for (size_t i = 0; i < mapped_count; ++i)
      if (fd_to_map[i] >= 0) UnmapChunk(mapped_now[i].target, mapped_now[i].size);
    if (placement.private_reservation != 0)
      FreeReservation(placement.private_reservation, placement.private_size);
    return result;
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult IpcOpenMemHandle(CUdeviceptr* pointer, const CUipcMemHandle& raw, unsigned int flags,
                          bool v2) {
  state::Vmm2Handle h;
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw.reserved);
  switch (state::DecodeHandle(bytes, &h)) {
    case state::DecodeStatus::kOk:
      break;
    case state::DecodeStatus::kNotVmm2:
      return ForwardOpen(pointer, raw, flags, v2);
    case state::DecodeStatus::kBadChecksum:
      // Four bytes of a foreign handle can spell "VMM2" by chance: let the
      // driver judge it (it refuses garbage safely, measured).
      VMMIPC_LOG_DEBUG("handle has the VMM2 magic but a bad checksum; passing it to the driver");
      return ForwardOpen(pointer, raw, flags, v2);
    case state::DecodeStatus::kUnknownVersion:
      stats::Count(stats::Counter::kOpenFailedBadHandle);
      OpenWarning(log::Level::kError,
                  "cuIpcOpenMemHandle: VMM2 handle version {} is not supported by this "
                  "vmmipc (knows version {}); use the same vmmipc in every process",
                  state::HandleVersion(bytes), state::kHandleVersion);
      return CUDA_ERROR_NOT_SUPPORTED;
    case state::DecodeStatus::kMalformed:
      stats::Count(stats::Counter::kOpenFailedBadHandle);
      OpenWarning(log::Level::kWarn,
                  "cuIpcOpenMemHandle: malformed VMM2 handle (fields contradict)");
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (pointer == nullptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    stats::Count(stats::Counter::kOpenFailedInvalid);
  if (pointer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    OpenWarning(log::Level::kWarn,
                "cuIpcOpenMemHandle: flags 0x{:x} refused; the driver only takes "
                "CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS",
                flags);
    return CUDA_ERROR_INVALID_VALUE;
  }
  ProcessState& state = State();
  if (h.pid == state.pid && h.instance == state.instance) {
    OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle: the handle was exported by this process");
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  CUdevice device = 0;
  if (VMMIPC_REAL(CtxGetDevice, &device) != CUDA_SUCCESS) {
    OpenWarning(log::Level::kWarn, "cuIpcOpenMemHandle: no current CUDA context");
    return CUDA_ERROR_INVALID_CONTEXT;
  }

  const state::OpenKey key{
      {h.pid, h.instance}, h.address, h.generation, h.region_base, h.rank_slot};
  if (Reopened(state, key, pointer)) return CUDA_SUCCESS;

  // The exchange with the exporter holds no lock: a stopped or slow exporter
  // delays only the opens of its own handles, each bounded by the timeout.
  const auto fetch_start = SteadyClock::now();
  const config::Params& params = config::Get();
  transport::FetchRequest request{h.pid,        h.capability,  h.address,    h.chunk_base,
                                  h.chunk_size, h.region_base, h.generation, h.rank_slot};
  // With follow on, the first open of an exporter's handle keeps its
  // connection for the exporter's pause and resume events.
  FollowedOpen followed(state, h);
  transport::FetchResult fetched =
      transport::FetchChunks(request, {params.socket_dir, static_cast<int>(params.timeout_ms),
                                       followed.watch(), followed.follower()});
  if (fetched.status != transport::FetchStatus::kOk) return FetchFailure(fetched, h);
  stats::Count(stats::Counter::kFdsReceived, fetched.chunks.size());
  if (!RunIsConsistent(fetched.chunks, h)) {
    stats::Count(stats::Counter::kOpenFailedProtocol);
    OpenWarning(log::Level::kWarn,
                "cuIpcOpenMemHandle: exporter pid {} answered with a run that does not "
                "match the handle (chunk 0x{:x}+0x{:x})",
                h.pid, h.chunk_base, h.chunk_size);
    return CUDA_ERROR_MAP_FAILED;
  }
  const int64_t fetch_us = MicrosSince(fetch_start);

  // Placement and mapping: under the placement lock of the exporter's slot
  // (of the exporter itself when it is unranked).
  std::lock_guard<std::mutex> placement_lock(state.importer.placement_mutex(h.rank_slot, h.pid));
  // Another thread may have opened the same handle while we fetched (the
  // fetched fds then close unused).
  if (Reopened(state, key, pointer)) return CUDA_SUCCESS;
  std::vector<state::FollowEvent> missed;
  if (!followed.TakeMissed(&missed)) {
    stats::Count(stats::Counter::kOpenFailedMap);
    OpenWarning(
        log::Level::kWarn,
        "cuIpcOpenMemHandle(pid {}, 0x{:x}): the exporter paused and resumed its memory more "
        "than {} times while it was opened; try again",
        h.pid, h.address, state::InFlightOpens::kMaxEvents);
    return CUDA_ERROR_MAP_FAILED;
  }
  if (state::AnyUnfollowed(missed)) {
    stats::Count(stats::Counter::kOpenFailedMap);
    VMMIPC_LOG_WARN(
        "cuIpcOpenMemHandle(pid {}, 0x{:x}): the exporter stopped following this process while "
        "it was opened (it missed too much, or its watch connection broke): nothing mapped; try "
        "again",
        h.pid, h.address);
    return CUDA_ERROR_MAP_FAILED;
  }
  const std::vector<state::FetchedChunk> run = ApplyMissed(missed, &fetched.chunks, h);
  const auto place_start = SteadyClock::now();
  Placement placement;
  VMMIPC_RETURN_IF_ERROR(PlaceRun(state, h, fetched.chunks, &placement));
  const int64_t place_us = MicrosSince(place_start);
  const auto map_start = SteadyClock::now();
  const uint64_t run_base = fetched.chunks.front().address;
  const state::ExporterId exporter{h.pid, h.instance};
  state::OpenRecord record;
  std::vector<state::MappedChunk> mapped_now;
  std::vector<int> fd_to_map;  // per chunk of mapped_now; -1: paused, nothing to map
  const uint64_t run_size = fetched.chunks.back().address + fetched.chunks.back().size - run_base;
  const bool other_run = state.importer.WithTable([&](state::ImportTable& imports) {
    // Another handle's open returned this pointer for another run (only
    // possible after a followed resume changed what lies there).
    if (imports.UseOf(placement.run_target + (h.address - run_base), placement.run_target,
                      run_size) == state::PointerUse::kOtherRun)
      return true;
    for (const state::FetchedChunk& chunk : run) {
      state::MappedChunk mapped{placement.run_target + (chunk.address - run_base),
                                chunk.size,
                                exporter,
                                chunk.address,
                                chunk.generation,
                                0,
                                static_cast<int32_t>(device),
                                chunk.paused};
      record.chunks.push_back(mapped.target);
      if (imports.Probe(mapped.target, mapped.size, exporter, mapped.exporter_address,
                        mapped.generation) == state::ChunkProbe::kSame)
        continue;  // an earlier open mapped it already: shared, reference counted
      mapped_now.push_back(mapped);
      fd_to_map.push_back(chunk.paused ? -1 : chunk.fd);
    }
    return false;
  });
  if (other_run) {
    stats::Count(stats::Counter::kOpenFailedMap);
    OpenWarning(
        log::Level::kWarn,
        "cuIpcOpenMemHandle(pid {}, 0x{:x}): an open of another run of the exporter already "
        "returned that pointer; close it first",
        h.pid, h.address);
    if (placement.private_reservation != 0)
      FreeReservation(placement.private_reservation, placement.private_size);
    return CUDA_ERROR_MAP_FAILED;
  }
  uint64_t import_and_map_us = 0;
  VMMIPC_RETURN_IF_ERROR(
      MapNewChunks(state, placement, mapped_now, fd_to_map, device, map_start, &import_and_map_us));
  record.key = key;
  record.pointer = placement.run_target + (h.address - run_base);
  record.run_base = placement.run_target;
  record.run_size = run_size;
  record.zone_slot = placement.zone_slot;
  record.private_reservation = placement.private_reservation;
  record.private_reservation_size = placement.private_size;
  state.importer.AddOpen(mapped_now, record);
  for (const auto& chunk : mapped_now) {
    stats::Count(stats::Counter::kChunksMapped);
    stats::Count(stats::Counter::kBytesMapped, chunk.size);
  }
  stats::Count(stats::Counter::kHandlesOpened);
  if (fetched.watch.fd.valid()) KeepWatch(state, h.pid, h.instance, std::move(fetched.watch));
  *pointer = record.pointer;
  VMMIPC_LOG_DEBUG(
      "opened 0x{:x} of pid {} at 0x{:x}: {} chunks, {} newly mapped; fetch {} us "
      "(connect {} us, answer {} us), place {} us, map {} us (import_map {} us, set_access {} us)",
      h.address, h.pid, record.pointer, record.chunks.size(), mapped_now.size(), fetch_us,
      fetched.connect_us, fetched.answer_us, place_us, MicrosSince(map_start), import_and_map_us,
      MicrosSince(map_start) - import_and_map_us);
  return CUDA_SUCCESS;
}

CUresult IpcCloseMemHandle(CUdeviceptr pointer) {
  ProcessState& state = State();
  // The placement lock of the open being closed, so that its unmaps cannot
  // interleave with an open placing chunks in the same slot (import_side.h).
  std::optional<state::OpenKey> key;
  const bool any_open = state.importer.WithTable([&](state::ImportTable& imports) {
    if (imports.open_count() == 0) return false;
    key = imports.KeyOf(pointer);
    return true;
  });
  if (!any_open) return VMMIPC_REAL(IpcCloseMemHandle, pointer);
  std::unique_lock<std::mutex> placement_lock;
  if (key)
    placement_lock = std::unique_lock<std::mutex>(
        state.importer.placement_mutex(key->rank_slot, key->exporter.pid));
  const state::CloseResult closed = state.importer.Close(pointer);
  // Not ours (legacy memory, or one close too many): the driver decides.
  if (!closed.ours) return VMMIPC_REAL(IpcCloseMemHandle, pointer);
  stats::Count(stats::Counter::kCloses);
  // Before the stretch's last chunk goes, so that its page tables stay.
  AnchorBeforeUnmap(state.importer, closed.to_unmap);
  for (const auto& chunk : closed.to_unmap) {
    if (chunk.paused) continue;  // its exporter paused it: nothing is mapped (follow)
    UnmapChunk(chunk.target, chunk.size);
    stats::Count(stats::Counter::kChunksUnmapped);
    stats::Count(stats::Counter::kBytesUnmapped, chunk.size);
  }
  if (closed.free_reservation != 0)
    FreeReservation(closed.free_reservation, closed.free_reservation_size);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
