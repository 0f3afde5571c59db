// The importer's half of follow: the watch an open asks for and keeps, and the
// follow thread's handling of its exporters' pauses and resumes.
#include "core/import/follow_import.h"

#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/log_limit.h"
#include "config/params.h"
#include "core/ahead.h"
#include "core/import/opening.h"
#include "core/import/vmm_calls.h"
#include "core/real.h"
#include "core/stats.h"

namespace vmmipc::core {

// The follow thread runs without a context of its own: use the importer's.
void UseFollowContext(const ImportSide& importer) {
  static thread_local bool context_set = false;
  if (!context_set && importer.follow().follow_context() != nullptr)
    context_set =
        VMMIPC_REAL(CtxSetCurrent, static_cast<CUcontext>(importer.follow().follow_context())) ==
        CUDA_SUCCESS;
}

namespace {

using transport::wire::AckStatus;
using transport::wire::Event;
using transport::wire::EventKind;

ledger::ExporterId ExporterOf(uint64_t tag) {
  return ledger::ExporterId{static_cast<uint32_t>(tag >> 32), tag & 0xFFFFFFFFu};
}

AckStatus FollowPause(ImportSide& importer, const ledger::ExporterId& exporter,
                      const Event& event) {
  const std::vector<ledger::MappedChunk> chunks =
      importer.Pause(exporter, event.base, event.generation);
  if (chunks.empty()) return AckStatus::kNotHeld;
  // The mapping goes; the range stays reserved (zone slot or the open's own
  // reservation) for the resume. Touching it now faults, as on the exporter.
  for (const ledger::MappedChunk& chunk : chunks) {
    UnmapChunk(chunk.target, chunk.size);
    stats::Count(stats::Counter::kFollowPauses);
  }
  VMMIPC_LOG_DEBUG("follow: pid {} paused 0x{:x}: unmapped {} chunk(s) here", exporter.pid,
                   event.base, chunks.size());
  return AckStatus::kDone;
}

AckStatus FollowResume(ImportSide& importer, const ledger::ExporterId& exporter, const Event& event,
                       int fd) {
  const std::vector<ledger::MappedChunk> chunks = importer.PausedAt(exporter, event.base);
  if (chunks.empty()) return AckStatus::kNotHeld;
  AckStatus status = AckStatus::kDone;
  for (const ledger::MappedChunk& chunk : chunks) {
    if (chunk.size != event.size) {
      stats::Count(stats::Counter::kFollowResumeRefused);
      VMMIPC_LOG_WARN(
          "follow: pid {} resumed 0x{:x} with {} where {} was paused; not mapped: the range at "
          "0x{:x} stays unmapped until it is closed",
          exporter.pid, event.base, log::Bytes(event.size), log::Bytes(chunk.size), chunk.target);
      status = AckStatus::kFailed;
      continue;
    }
    CUresult result = MapChunk(fd, chunk.target, chunk.size);
    if (result == CUDA_SUCCESS) {
      result = OpenAccess(chunk.target, chunk.size, chunk.device);
      if (result != CUDA_SUCCESS) UnmapChunk(chunk.target, chunk.size);
    }
    if (result != CUDA_SUCCESS) {
      stats::Count(stats::Counter::kFollowResumeRefused);
      VMMIPC_LOG_WARN("follow: mapping the resumed 0x{:x} of pid {} at 0x{:x} failed: {}",
                      event.base, exporter.pid, chunk.target, driver::ErrorName(result));
      status = AckStatus::kFailed;
      continue;
    }
    importer.Resume(chunk.target, event.generation);
    stats::Count(stats::Counter::kFollowResumes);
  }
  VMMIPC_LOG_DEBUG("follow: pid {} resumed 0x{:x}: {} chunk(s) mapped again here", exporter.pid,
                   event.base, chunks.size());
  return status;
}

// The exporter no longer follows this process (it missed too much), or its
// connection broke while it runs: every mapping of its memory here is
// dropped, loudly, rather than left to go stale. The ranges stay reserved;
// closes still work; touching them faults.
AckStatus FollowUnfollowed(ImportSide& importer, const ledger::ExporterId& exporter) {
  const std::vector<ledger::MappedChunk> chunks = importer.PauseAll(exporter);
  for (const ledger::MappedChunk& chunk : chunks) UnmapChunk(chunk.target, chunk.size);
  stats::Count(stats::Counter::kFollowPauses, chunks.size());
  VMMIPC_LOG_WARN(
      "follow: exporter pid {} no longer follows this process; its {} chunk(s) mapped here are "
      "unmapped rather than left stale (touching them faults): close its handles and open "
      "them again",
      exporter.pid, chunks.size());
  return AckStatus::kDone;
}

// Ahead: the runs mapped ahead of `exporter` that an event names (`all`:
// every one) go, as their last close would: nothing made ahead outlives the
// memory's pause or free, or the exporter's being followed. Caller holds the
// exporter's placement locks.
size_t DropOpensAhead(ImportSide& importer, const ledger::ExporterId& exporter, uint64_t base,
                      bool all) {
  const ledger::CloseResult dropped = importer.DropAhead(exporter, base, all);
  if (UnmapDroppedAhead(dropped)) {
    VMMIPC_LOG_DEBUG("ahead: dropped what was mapped ahead of pid {}{}: {} chunk(s) unmapped",
                     exporter.pid, all ? "" : fmt::format(" at 0x{:x}", base),
                     dropped.to_unmap.size());
  }
  return dropped.to_unmap.size() + (dropped.ours ? 1 : 0);
}

// Logs `event` for this exporter's opens in flight (they apply it before
// they map: ledger/in_flight_opens.h). A resume's fd is shared by them.
bool LogForOpensInFlight(ImportSide& importer, const ledger::ExporterId& exporter,
                         const Event& event, ScopedFd fd) {
  ledger::FollowEvent logged;
  logged.resume = event.kind == EventKind::kResume;
  logged.unfollowed = event.kind == EventKind::kUnfollowed;
  logged.base = event.base;
  logged.size = event.size;
  logged.generation = event.generation;
  if (fd.valid()) logged.fd = std::make_shared<ScopedFd>(std::move(fd));
  return importer.LogForOpensInFlight(exporter, logged);
}

// One event of exporter `tag` (pid << 32 | instance) for what is mapped here
// and the opens in flight.
AckStatus OnMappedEvent(uint64_t tag, const Event& event, ScopedFd fd) noexcept {
  try {
    ImportSide& importer = Importer();
    UseFollowContext(importer);
    const ledger::ExporterId exporter{static_cast<uint32_t>(tag >> 32), tag & 0xFFFFFFFFu};
    // Every placement lock of the exporter's opens, recorded and in flight,
    // as opens and closes take one of them: no close can unmap what this
    // maps, no open can probe it, and no open in flight can be between
    // taking its log and recording its chunks (ledger/in_flight_opens.h).
    const std::vector<size_t> indexes = importer.PlacementIndexesOf(exporter);
    if (indexes.empty()) return AckStatus::kNotHeld;  // every open of it was closed
    std::vector<std::unique_lock<std::mutex>> placement;
    for (size_t index : indexes) placement.emplace_back(importer.placement_mutex_at(index));
    if (event.kind == EventKind::kUnfollowed) {
      // Its opens in flight must not map what it no longer follows either.
      LogForOpensInFlight(importer, exporter, event, ScopedFd());
      DropOpensAhead(importer, exporter, 0, true);
      return FollowUnfollowed(importer, exporter);
    }
    const bool dropped_ahead = event.kind == EventKind::kPause &&
                               DropOpensAhead(importer, exporter, event.base, false) != 0;
    AckStatus status = event.kind == EventKind::kPause
                           ? FollowPause(importer, exporter, event)
                           : FollowResume(importer, exporter, event, fd.get());
    if (dropped_ahead && status == AckStatus::kNotHeld) status = AckStatus::kDone;
    if (LogForOpensInFlight(importer, exporter, event, std::move(fd)) &&
        status == AckStatus::kNotHeld)
      status = AckStatus::kDone;  // an open in flight holds it: it will not map the old memory
    return status;
  } catch (...) {
    return AckStatus::kFailed;
  }
}

// Ahead: an exporter announced a handle it handed out. Queued for the
// ahead thread (core/import/ahead.h) when it names that exporter's
// memory; acked at once either way (it asks for nothing).
AckStatus OnAnnounce(uint64_t tag, const Event& event) noexcept {
  try {
    if (!AheadOn()) return AckStatus::kNotHeld;
    stats::Count(stats::Counter::kAnnouncementsReceived);
    ledger::Vmm2Handle h;
    static_assert(sizeof(event.handle) == ledger::kHandleSize);
    const ledger::ExporterId exporter = ExporterOf(tag);
    if (ledger::DecodeHandle(event.handle.data(), &h) != ledger::DecodeStatus::kOk ||
        h.pid != exporter.pid || h.instance != exporter.instance) {
      // Only its own memory: a same-user exporter could otherwise make this
      // process fetch from another one (which any handle could, but not unasked).
      stats::Count(stats::Counter::kAnnouncementsDropped);
      VMMIPC_LOG_DEBUG("ahead: pid {} announced a handle that is not its own; ignored",
                       exporter.pid);
      return AckStatus::kFailed;
    }
    if (!Importer().ahead().Queue(event.handle, MapAhead))
      stats::Count(stats::Counter::kAnnouncementsDropped);
    return AckStatus::kDone;
  } catch (...) {
    return AckStatus::kFailed;
  }
}

// The follow thread's handler.
AckStatus OnEvent(uint64_t tag, const Event& event, ScopedFd fd) noexcept {
  if (event.kind == EventKind::kAnnounce) return OnAnnounce(tag, event);
  return OnMappedEvent(tag, event, std::move(fd));
}

// The watch connection to exporter `tag` ended (it exited, or broke the
// protocol): nothing would tell this process of its unmaps any more.
void OnWatchEnded(uint64_t tag) noexcept {
  try {
    ImportSide& importer = Importer();
    UseFollowContext(importer);
    const ledger::ExporterId exporter = ExporterOf(tag);
    {
      std::vector<std::unique_lock<std::mutex>> placement;
      for (size_t index : importer.PlacementIndexesOf(exporter))
        placement.emplace_back(importer.placement_mutex_at(index));
      DropOpensAhead(importer, exporter, 0, true);
    }
  } catch (...) {
  }
}

uint64_t Tag(uint32_t pid, uint32_t instance) { return (uint64_t{pid} << 32) | instance; }

}  // namespace

bool StartWatch(ImportSide& importer, uint32_t pid, uint32_t instance) {
  if (!config::Get().follow) return false;
  return importer.follow().StartWatch(Tag(pid, instance), config::Get().timeout());
}

void EndWatch(ImportSide& importer, uint32_t pid, uint32_t instance) {
  importer.follow().EndWatch(Tag(pid, instance));
}

uint32_t FollowerId(ImportSide& importer) {
  return config::Get().follow ? importer.follow().follower_id() : 0;
}

void KeepWatch(ImportSide& importer, uint32_t pid, uint32_t instance,
               transport::WatchConnection connection) {
  // The first kept watch makes the client; its thread uses the context of
  // this open from its first event on.
  auto make = [](void** context) {
    CUcontext current = nullptr;
    if (VMMIPC_REAL(CtxGetCurrent, &current) == CUDA_SUCCESS) *context = current;
    return std::make_unique<transport::WatchClient>(OnEvent, config::Get().timeout(), OnWatchEnded);
  };
  std::string error;
  // An open of each exporter not followed yet asks again: rate-limited.
  static log::LineLimit lines;
  if (!importer.follow().AddWatch(Tag(pid, instance), std::move(connection), make, &error)) {
    log::LogLimited(lines, log::Level::kWarn, "follow", "failures to follow an exporter",
                    "follow: cannot follow exporter pid {}: {}; its pauses and resumes are not "
                    "followed here",
                    pid, error);
  }
}

}  // namespace vmmipc::core
