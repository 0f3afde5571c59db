// Follow's part in one open: the watch it asks for, its place among the opens
// in flight, and the catch-up on what its exporter did during the fetch.
#include "core/import/followed_open.h"

#include <vector>

#include "core/import/follow_import.h"
#include "core/import/vmm_calls.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

// The fetched run as the open will place it, after what its exporter paused
// and resumed while it was fetched.
std::vector<ledger::FetchedChunk> ApplyMissed(const std::vector<ledger::FollowEvent>& missed,
                                              const Opening& open) {
  std::vector<ledger::FetchedChunk> run;
  for (const transport::ChunkGrant& grant : open.fetched.chunks)
    run.push_back(
        {grant.address, grant.size, grant.generation, grant.fd.get(), false, false, nullptr});
  if (missed.empty()) return run;
  ledger::ApplyFollowEvents(missed, &run);
  for (const ledger::FetchedChunk& chunk : run) {
    if (chunk.paused) stats::Count(stats::Counter::kFollowPauses);
    if (chunk.refused) {
      stats::Count(stats::Counter::kFollowResumeRefused);
      OpenWarning(
          log::Level::kWarn,
          "follow: pid {} resumed 0x{:x} with other memory while it was being opened here; not "
          "mapped: the range stays unmapped until it is closed",
          open.handle.pid, chunk.address);
    }
  }
  VMMIPC_LOG_DEBUG("follow: pid {} paused or resumed {} time(s) while 0x{:x} was opened here",
                   open.handle.pid, missed.size(), open.handle.address);
  return run;
}

}  // namespace

FollowedOpen::FollowedOpen(ImportSide& importer, const ledger::Vmm2Handle& handle)
    : importer_(importer), exporter_{handle.pid, handle.instance}, follower_(FollowerId(importer)) {
  if (follower_ == 0) return;
  watch_ = StartWatch(importer, handle.pid, handle.instance);
  in_flight_ =
      importer.BeginOpen(exporter_, ImportSide::PlacementIndex(handle.rank_slot, handle.pid));
}

FollowedOpen::~FollowedOpen() {
  bool overflowed = false;
  if (in_flight_ != 0) importer_.EndOpen(in_flight_, &overflowed);
  if (watch_) EndWatch(importer_, exporter_.pid, static_cast<uint32_t>(exporter_.instance));
}

CUresult FollowedOpen::CatchUp(Opening* open, std::optional<uint64_t>* reopened) {
  const ledger::Vmm2Handle& h = open->handle;
  std::vector<ledger::FollowEvent> missed;
  bool overflowed = false;
  // The open stays listed in flight (its placement lock) until it ends, after
  // its record: an event from now on waits for that lock and finds the record.
  *reopened =
      importer_.ReopenOrEndOpen(open->key, &open->reopener, in_flight_, &missed, &overflowed);
  if (*reopened) return CUDA_SUCCESS;
  if (overflowed) {
    stats::Count(stats::Counter::kOpenFailedMap);
    OpenWarning(
        log::Level::kWarn,
        "cuIpcOpenMemHandle(pid {}, 0x{:x}): the exporter paused and resumed its memory more "
        "than {} times while it was opened; try again",
        h.pid, h.address, ledger::InFlightOpens::kMaxEvents);
    return CUDA_ERROR_MAP_FAILED;
  }
  if (ledger::AnyUnfollowed(missed)) {
    stats::Count(stats::Counter::kOpenFailedMap);
    VMMIPC_LOG_WARN(
        "cuIpcOpenMemHandle(pid {}, 0x{:x}): the exporter stopped following this process while "
        "it was opened (it missed too much, or its watch connection broke): nothing mapped; try "
        "again",
        h.pid, h.address);
    return CUDA_ERROR_MAP_FAILED;
  }
  open->run = ApplyMissed(missed, *open);
  return CUDA_SUCCESS;
}

}  // namespace vmmipc::core
