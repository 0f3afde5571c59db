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

ImportedAhead::~ImportedAhead() {
  for (const auto& [fd, handle] : by_fd) ReleaseImported(handle);
}

uint64_t ImportedAhead::Take(int fd) {
  auto it = by_fd.find(fd);
  if (it == by_fd.end()) return 0;
  const uint64_t handle = it->second;
  by_fd.erase(it);
  return handle;
}

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
    // Prefetch may have imported it already: then only the map is left.
    const uint64_t ahead = open->imported.Take(plan.fd_to_map[mapped_count]);
    if (ahead != 0) stats::Count(stats::Counter::kChunksImportedAhead);
    result = ahead != 0 ? MapImportedChunk(ahead, chunk.target, chunk.size)
                        : MapChunk(plan.fd_to_map[mapped_count], chunk.target, chunk.size);
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
  record.ahead = open->ahead;
  record.device = static_cast<int32_t>(open->device);
  if (!importer.AddOpen(open->plan.mapped_now, record)) return;  // ahead: open already
  for (const ledger::MappedChunk& chunk : open->plan.mapped_now) {
    stats::Count(stats::Counter::kChunksMapped);
    stats::Count(stats::Counter::kBytesMapped, chunk.size);
  }
  stats::Count(open->ahead ? stats::Counter::kOpensAhead : stats::Counter::kHandlesOpened);
  if (open->fetched.watch.fd.valid())
    KeepWatch(importer, h.pid, h.instance, std::move(open->fetched.watch));
  const int64_t map_us = MicrosSince(open->map_start);
  VMMIPC_LOG_DEBUG(
      "opened{} 0x{:x} of pid {} at 0x{:x}: {} chunks, {} newly mapped; fetch {} us "
      "({} {} us, answer {} us), place {} us, map {} us (import_map {} us, set_access {} us)",
      open->ahead ? " ahead" : "", h.address, h.pid, record.pointer, record.chunks.size(),
      open->plan.mapped_now.size(), open->fetch_us,
      open->fetched.warm ? "warm connection" : "connect", open->fetched.connect_us,
      open->fetched.answer_us, open->place_us, map_us, open->import_and_map_us,
      map_us - open->import_and_map_us);
}

}  // namespace vmmipc::core
