// The open's map and record steps: the planned chunks mapped and opened for
// the device, then the open entered in the import table.
#include "core/import/follow_import.h"
#include "core/import/opening.h"
#include "core/import/vmm_calls.h"
#include "core/import/zone_anchors.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

// One cuMemSetAccess per contiguous stretch of newly mapped chunks.
CUresult OpenAccessByStretch(const ImportSide::RunPlan& plan, CUdevice device) {
  const std::vector<ledger::MappedChunk>& chunks = plan.mapped_now;
  CUresult result = CUDA_SUCCESS;
  for (size_t i = 0; result == CUDA_SUCCESS && i < chunks.size();) {
    if (plan.fd_to_map[i] < 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < chunks.size() && plan.fd_to_map[j] >= 0 &&
           chunks[j].target == chunks[j - 1].target + chunks[j - 1].size)
      ++j;
    const uint64_t end = chunks[j - 1].target + chunks[j - 1].size;
    result = OpenAccess(chunks[i].target, end - chunks[i].target, device);
    i = j;
  }
  return result;
}

}  // namespace

CUresult MapRun(ImportSide& importer, Opening* open) {
  open->map_start = SteadyClock::now();
  const Placement& placement = open->placement;
  const ImportSide::RunPlan& plan = open->plan;
  CUresult result = CUDA_SUCCESS;
  // A page-table anchor where a chunk goes moves out of the way first.
  if (placement.zone_slot != ledger::kNotInZone &&
      !ClearAnchorsFor(importer, placement.zone_slot, plan.mapped_now))
    result = CUDA_ERROR_MAP_FAILED;
  size_t mapped_count = 0;
  for (; result == CUDA_SUCCESS && mapped_count < plan.mapped_now.size(); ++mapped_count) {
    if (plan.fd_to_map[mapped_count] < 0) continue;  // paused by its exporter: the range waits
    const ledger::MappedChunk& chunk = plan.mapped_now[mapped_count];
    result = MapChunk(plan.fd_to_map[mapped_count], chunk.target, chunk.size);
    if (result != CUDA_SUCCESS) break;
  }
  open->import_and_map_us = MicrosSince(open->map_start);
  if (result == CUDA_SUCCESS) result = OpenAccessByStretch(plan, open->device);
  if (result == CUDA_SUCCESS) return CUDA_SUCCESS;
  stats::Count(stats::Counter::kOpenFailedMap);
  for (size_t i = 0; i < mapped_count; ++i)
    if (plan.fd_to_map[i] >= 0) UnmapChunk(plan.mapped_now[i].target, plan.mapped_now[i].size);
  if (placement.private_reservation != 0)
    FreeReservation(placement.private_reservation, placement.private_size);
  return result;
}

void RecordOpen(ImportSide& importer, Opening* open) {
  const ledger::Vmm2Handle& h = open->handle;
  ledger::OpenRecord record;
  record.key = open->key;
  record.chunks = open->plan.targets;
  record.pointer = open->pointer();
  record.run_base = open->placement.run_target;
  record.run_size = open->run_size();
  record.zone_slot = open->placement.zone_slot;
  record.private_reservation = open->placement.private_reservation;
  record.private_reservation_size = open->placement.private_size;
  record.state = open->advances_to;
  record.opened_address = open->opened_address;
  record.device = static_cast<int32_t>(open->device);
  if (!importer.AddOpen(open->plan.mapped_now, record)) return;  // ahead: mapped already
  for (const ledger::MappedChunk& chunk : open->plan.mapped_now) {
    stats::Count(stats::Counter::kChunksMapped);
    stats::Count(stats::Counter::kBytesMapped, chunk.size);
  }
  // The counter of the state the run reached: opens_ahead, handles_opened.
  constexpr stats::Counter kReached[] = {stats::Counter::kOpensAhead,
                                         stats::Counter::kHandlesOpened};
  static_assert(static_cast<int>(ledger::RunState::kMappedAhead) == 0 &&
                static_cast<int>(ledger::RunState::kOpened) == 1);
  stats::Count(kReached[static_cast<int>(open->advances_to)]);
  if (open->fetched.watch.fd.valid())
    KeepWatch(importer, h.pid, h.instance, std::move(open->fetched.watch));
  const int64_t map_us = MicrosSince(open->map_start);
  VMMIPC_LOG_DEBUG(
      "{} 0x{:x} of pid {} at 0x{:x}: {} chunks, {} newly mapped; fetch {} us "
      "({} {} us, answer {} us), place {} us, map {} us (import_map {} us, set_access {} us)",
      ledger::RunStateName(open->advances_to), h.address, h.pid, record.pointer,
      record.chunks.size(), open->plan.mapped_now.size(), open->fetch_us,
      open->fetched.warm ? "warm connection" : "connect", open->fetched.connect_us,
      open->fetched.answer_us, open->place_us, map_us, open->import_and_map_us,
      map_us - open->import_and_map_us);
}

}  // namespace vmmipc::core
