// Both sides of follow: the exporter's notices from its unmap/map hooks, and
// the importer's handling of them on its follow thread.
#include "core/follow.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/log_limit.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
#include "core/import/vmm_calls.h"
#include "core/real.h"
#include "core/stats.h"
#include "transport/socket_io.h"

namespace vmmipc::core {
namespace {

std::string PidList(const std::vector<std::pair<uint32_t, uint32_t>>& followers) {
  std::string out;
  for (const auto& [follower, pid] : followers)
    out += (out.empty() ? "" : ", ") + transport::PeerPidText(pid);
  return out;
}

// Sends `notices` and accounts for the answers: counters, and one warning
// naming the importers that stopped answering in this call (a lagging one is
// not waited for again, nor named again, until it has caught up).
transport::NotifyResult Notify(ProcessState& state,
                               const std::vector<transport::WatchNotice>& notices,
                               const char* what) {
  const int timeout_ms = static_cast<int>(config::Get().timeout_ms);
  transport::NotifyResult result = state.exporter.listener().Notify(notices, timeout_ms);
  stats::Count(stats::Counter::kFollowNotices, result.events_sent);
  if (!result.newly_lagging.empty()) {
    stats::Count(stats::Counter::kFollowUnanswered, result.newly_lagging.size());
    VMMIPC_LOG_WARN(
        "follow: importer {} did not answer the {} of {} chunk(s) from 0x{:x} within {} ms "
        "(stopped or hung?); not waiting for it again until it answers, then it is sent what "
        "it missed",
        PidList(result.newly_lagging), what, notices.size(), notices.front().base, timeout_ms);
  }
  return result;
}

// The followers that should hear of a resume: those that followed the
// pause, and the lagging ones (they catch up).
std::vector<uint32_t> Followers(const std::vector<uint32_t>& holders,
                                const transport::NotifyResult& result, size_t notice) {
  std::vector<uint32_t> followers = result.done[notice];
  for (uint32_t follower : holders)
    if (std::count(result.lagging.begin(), result.lagging.end(), follower) != 0 &&
        std::count(followers.begin(), followers.end(), follower) == 0)
      followers.push_back(follower);
  return followers;
}

// The follow thread runs without a context of its own: use the importer's.
void UseFollowContext(const ProcessState& state) {
  static thread_local bool context_set = false;
  if (!context_set && state.importer.follow().follow_context() != nullptr)
    context_set = VMMIPC_REAL(CtxSetCurrent,
                              static_cast<CUcontext>(state.importer.follow().follow_context())) ==
                  CUDA_SUCCESS;
}

using transport::wire::AckStatus;
using transport::wire::Event;
using transport::wire::EventKind;

AckStatus FollowPause(ProcessState& state, const state::ExporterId& exporter, const Event& event) {
  const std::vector<state::MappedChunk> chunks =
      state.importer.Pause(exporter, event.base, event.generation);
  if (chunks.empty()) return AckStatus::kNotHeld;
  // The mapping goes; the range stays reserved (zone slot or the open's own
  // reservation) for the resume. Touching it now faults, as on the exporter.
  for (const state::MappedChunk& chunk : chunks) {
    UnmapChunk(chunk.target, chunk.size);
    stats::Count(stats::Counter::kFollowPauses);
  }
  VMMIPC_LOG_DEBUG("follow: pid {} paused 0x{:x}: unmapped {} chunk(s) here", exporter.pid,
                   event.base, chunks.size());
  return AckStatus::kDone;
}

AckStatus FollowResume(ProcessState& state, const state::ExporterId& exporter, const Event& event,
                       int fd) {
  const std::vector<state::MappedChunk> chunks = state.importer.PausedAt(exporter, event.base);
  if (chunks.empty()) return AckStatus::kNotHeld;
  AckStatus status = AckStatus::kDone;
  for (const state::MappedChunk& chunk : chunks) {
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
    state.importer.Resume(chunk.target, event.generation);
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
AckStatus FollowUnfollowed(ProcessState& state, const state::ExporterId& exporter) {
  const std::vector<state::MappedChunk> chunks = state.importer.PauseAll(exporter);
  for (const state::MappedChunk& chunk : chunks) UnmapChunk(chunk.target, chunk.size);
  stats::Count(stats::Counter::kFollowPauses, chunks.size());
  VMMIPC_LOG_WARN(
      "follow: exporter pid {} no longer follows this process; its {} chunk(s) mapped here are "
      "unmapped rather than left stale (touching them faults): close its handles and open "
      "them again",
      exporter.pid, chunks.size());
  return AckStatus::kDone;
}

// Logs `event` for this exporter's opens in flight (they apply it before
// they map: state/in_flight_opens.h). A resume's fd is shared by them.
bool LogForOpensInFlight(ProcessState& state, const state::ExporterId& exporter, const Event& event,
                         ScopedFd fd) {
  state::FollowEvent logged;
  logged.resume = event.kind == EventKind::kResume;
  logged.unfollowed = event.kind == EventKind::kUnfollowed;
  logged.base = event.base;
  logged.size = event.size;
  logged.generation = event.generation;
  if (fd.valid()) logged.fd = std::make_shared<ScopedFd>(std::move(fd));
  return state.importer.LogForOpensInFlight(exporter, logged);
}

// The follow thread's handler: one event of exporter `tag` (pid << 32 | instance).
AckStatus OnEvent(uint64_t tag, const Event& event, ScopedFd fd) noexcept {
  try {
    ProcessState& state = State();
    UseFollowContext(state);
    const state::ExporterId exporter{static_cast<uint32_t>(tag >> 32), tag & 0xFFFFFFFFu};
    // Every placement lock of the exporter's opens, recorded and in flight,
    // as opens and closes take one of them: no close can unmap what this
    // maps, no open can probe it, and no open in flight can be between
    // taking its log and recording its chunks (state/in_flight_opens.h).
    const std::vector<size_t> indexes = state.importer.PlacementIndexesOf(exporter);
    if (indexes.empty()) return AckStatus::kNotHeld;  // every open of it was closed
    std::vector<std::unique_lock<std::mutex>> placement;
    for (size_t index : indexes) placement.emplace_back(state.importer.placement_mutex_at(index));
    if (event.kind == EventKind::kUnfollowed) {
      // Its opens in flight must not map what it no longer follows either.
      LogForOpensInFlight(state, exporter, event, ScopedFd());
      return FollowUnfollowed(state, exporter);
    }
    AckStatus status = event.kind == EventKind::kPause
                           ? FollowPause(state, exporter, event)
                           : FollowResume(state, exporter, event, fd.get());
    if (LogForOpensInFlight(state, exporter, event, std::move(fd)) && status == AckStatus::kNotHeld)
      status = AckStatus::kDone;  // an open in flight holds it: it will not map the old memory
    return status;
  } catch (...) {
    return AckStatus::kFailed;
  }
}

uint64_t Tag(uint32_t pid, uint32_t instance) { return (uint64_t{pid} << 32) | instance; }

}  // namespace

void FollowUnmap(ProcessState& state, const state::TakenMappings& taken) {
  if (!state.exporter.listener_ready()) return;  // never exported
  std::vector<transport::WatchNotice> notices;
  std::vector<const std::vector<uint32_t>*> holders;
  for (size_t i = 0; i < taken.records.size(); ++i) {
    if (taken.holders[i].empty()) continue;
    const state::VmmMapping& record = taken.records[i];
    transport::WatchNotice notice;
    notice.kind = EventKind::kPause;
    notice.base = record.base;
    notice.size = record.size;
    notice.generation = record.generation;
    notice.followers = taken.holders[i];
    notices.push_back(std::move(notice));
    holders.push_back(&taken.holders[i]);
  }
  if (notices.empty()) return;
  const transport::NotifyResult result = Notify(state, notices, "pause");
  for (size_t i = 0; i < notices.size(); ++i) {
    std::vector<uint32_t> followers = Followers(*holders[i], result, i);
    if (followers.empty()) continue;
    state.exporter.mappings().NotePaused({notices[i].base, notices[i].size, std::move(followers)});
  }
}

void FollowMap(ProcessState& state, const state::VmmMapping& mapping) {
  if (!state.exporter.listener_ready()) return;
  std::optional<state::PausedChunk> paused = state.exporter.mappings().TakePaused(mapping.base);
  if (!paused) return;
  ScopedFd fd;
  CUresult exported = CUDA_ERROR_INVALID_VALUE;
  if (mapping.posix_fd_exportable) exported = FdForChunk(state.exporter, mapping, &fd);
  if (exported != CUDA_SUCCESS) {
    VMMIPC_LOG_WARN(
        "follow: the memory mapped again at 0x{:x} cannot be exported ({}); {} importer(s) "
        "keep the range unmapped",
        mapping.base,
        mapping.posix_fd_exportable ? driver::ErrorName(exported)
                                    : "created without POSIX fd export",
        paused->holders.size());
    return;
  }
  transport::WatchNotice notice;
  notice.kind = EventKind::kResume;
  notice.base = mapping.base;
  notice.size = mapping.size;
  notice.generation = mapping.generation;
  notice.fd = fd.get();
  notice.followers = paused->holders;
  const transport::NotifyResult result = Notify(state, {notice}, "resume");
  // They hold the new memory now: a later pause tells them again.
  for (uint32_t follower : Followers(paused->holders, result, 0))
    state.exporter.mappings().AddHolder(mapping.base, mapping.generation, follower);
}

bool StartWatch(ProcessState& state, uint32_t pid, uint32_t instance) {
  if (!config::Get().follow) return false;
  return state.importer.follow().StartWatch(Tag(pid, instance),
                                            static_cast<int>(config::Get().timeout_ms));
}

void EndWatch(ProcessState& state, uint32_t pid, uint32_t instance) {
  state.importer.follow().EndWatch(Tag(pid, instance));
}

uint32_t FollowerId(ProcessState& state) {
  return config::Get().follow ? state.importer.follow().follower_id() : 0;
}

void KeepWatch(ProcessState& state, uint32_t pid, uint32_t instance,
               transport::WatchConnection connection) {
  // The first kept watch makes the client; its thread uses the context of
  // this open from its first event on.
  auto make = [](void** context) {
    CUcontext current = nullptr;
    if (VMMIPC_REAL(CtxGetCurrent, &current) == CUDA_SUCCESS) *context = current;
    return std::make_unique<transport::WatchClient>(OnEvent,
                                                    static_cast<int>(config::Get().timeout_ms));
  };
  std::string error;
  // An open of each exporter not followed yet asks again: rate-limited.
  static log::LineLimit lines;
  if (!state.importer.follow().AddWatch(Tag(pid, instance), std::move(connection), make, &error))
    log::LogLimited(lines, log::Level::kWarn, "follow", "failures to follow an exporter",
                    "follow: cannot follow exporter pid {}: {}; its pauses and resumes are not "
                    "followed here",
                    pid, error);
}

}  // namespace vmmipc::core
