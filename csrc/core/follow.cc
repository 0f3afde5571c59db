// The exporter's half of follow: the notices of its unmap and map hooks to
// the importers that hold the chunks (the importer's half is
// core/import/follow_import.cc).
#include "core/follow.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "config/params.h"
#include "core/export/exported_fds.h"
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
  const Timeout timeout = config::Get().timeout();
  transport::NotifyResult result = state.exporter.listener().Notify(notices, timeout);
  stats::Count(stats::Counter::kFollowNotices, result.events_sent);
  if (!result.newly_lagging.empty()) {
    stats::Count(stats::Counter::kFollowUnanswered, result.newly_lagging.size());
    VMMIPC_LOG_WARN(
        "follow: importer {} did not answer the {} of {} chunk(s) from 0x{:x} within {} ms "
        "(stopped or hung?); not waiting for it again until it answers, then it is sent what "
        "it missed",
        PidList(result.newly_lagging), what, notices.size(), notices.front().base, timeout.ms());
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

using transport::wire::EventKind;

std::atomic<bool> said_unfollowed{false};

}  // namespace

void SayUnfollowedUnmap(const ledger::TakenMappings& taken) {
  std::map<uint32_t, uint64_t> bytes_by_pid;
  size_t chunks = 0;
  for (size_t i = 0; i < taken.unfollowed.size() && i < taken.records.size(); ++i) {
    if (taken.unfollowed[i].empty()) continue;
    ++chunks;
    stats::Count(stats::Counter::kUnfollowedBytes, taken.records[i].size);
    for (uint32_t pid : taken.unfollowed[i]) bytes_by_pid[pid] += taken.records[i].size;
  }
  if (chunks == 0) return;
  stats::Count(stats::Counter::kUnfollowedUnmaps, chunks);
  if (said_unfollowed.exchange(true, std::memory_order_relaxed)) return;
  std::string who;
  uint64_t pinned = 0;
  for (const auto& [pid, bytes] : bytes_by_pid) {
    if (who.size() < 200)
      who += fmt::format("{}{} ({} MiB)", who.empty() ? "" : ", ",
                         pid == ledger::VmmMappings::kUnknownPid
                             ? "a process outside this pid namespace"
                             : transport::PeerPidText(pid),
                         bytes >> 20);
    pinned = std::max(pinned, bytes);
  }
  const bool here = !config::Get().follow;
  VMMIPC_LOG_WARN(
      "follow: {} chunk(s) unmapped here were granted to {} without follow ({}): each keeps "
      "that memory allocated for as long as it maps it (at least {} MiB stay pinned), and "
      "after a resume it still reads the old memory; {} (this is said once; VMMIPC_STATS "
      "counts every such unmap)",
      chunks, who,
      here ? "VMMIPC_FOLLOW=0 here" : "VMMIPC_FOLLOW=0 there, or a vmmipc without follow",
      pinned >> 20,
      here ? "remove VMMIPC_FOLLOW=0 here (follow is on by default)"
           : "remove VMMIPC_FOLLOW=0 there, or use the same vmmipc in every process");
}

void FollowUnmap(ProcessState& state, const ledger::TakenMappings& taken) {
  if (!state.exporter.listener_ready()) return;  // never exported
  std::vector<transport::WatchNotice> notices;
  std::vector<const std::vector<uint32_t>*> holders;
  for (size_t i = 0; i < taken.records.size(); ++i) {
    if (taken.holders[i].empty()) continue;
    const ledger::VmmMapping& record = taken.records[i];
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

void FollowMap(ProcessState& state, const ledger::VmmMapping& mapping) {
  if (!state.exporter.listener_ready()) return;
  std::optional<ledger::PausedChunk> paused = state.exporter.mappings().TakePaused(mapping.base);
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

}  // namespace vmmipc::core
