// The importer's hooks: cuIpcOpenMemHandle of a VMM2 handle as its named
// steps (core/import/opening.h), and cuIpcCloseMemHandle (the last close of a
// chunk unmaps it). Foreign handles and pointers go to the real driver
// unchanged.
#include <algorithm>
#include <mutex>
#include <optional>

#include "core/hooks.h"
#include "core/import/follow_import.h"
#include "core/import/followed_open.h"
#include "core/import/opening.h"
#include "core/import/vmm_calls.h"
#include "core/import/zone_anchors.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

// The same handle already open here: one more open of its pointer, or the
// adoption of a run mapped ahead (nothing for the ahead worker to do).
bool Reopened(std::optional<uint64_t> again, const Opening& open, CUdeviceptr* pointer) {
  if (!again) return false;
  if (open.reopener.adopted) stats::Count(stats::Counter::kOpensAdopted);
  if (open.reopener.reopened) stats::Count(stats::Counter::kReopens);
  *pointer = *again;
  return true;
}

}  // namespace

CUresult OpenDecoded(ImportSide& importer, Opening* open, CUdeviceptr* pointer) {
  open->reopener = {};
  open->reopener.advances_to = open->advances_to;
  open->reopener.device = static_cast<int32_t>(open->device);
  open->reopener.opened_address = open->opened_address;
  if (Reopened(importer.Reopen(open->key, &open->reopener), *open, pointer)) return CUDA_SUCCESS;
  FollowedOpen followed(importer, open->handle);
  VMMIPC_RETURN_IF_ERROR(FetchRun(followed, open));
  // Placement and mapping: under the placement lock of the exporter's slot
  // (of the exporter itself when it is unranked).
  std::lock_guard<std::mutex> placement_lock(
      importer.placement_mutex(open->handle.rank_slot, open->handle.pid));
  // Another thread may have opened the same handle while this one fetched
  // (the fetched fds then close unused), or opened it ahead.
  std::optional<uint64_t> again;
  VMMIPC_RETURN_IF_ERROR(followed.CatchUp(open, &again));
  if (Reopened(again, *open, pointer)) return CUDA_SUCCESS;
  // A run of memory the exporter paused or changed while it was fetched is
  // not mapped ahead: its record would outlive a free it already heard of.
  // Nor once its watch connection is gone: nothing would drop it (the watch
  // client forgets the connection before it drops what was mapped ahead
  // under these placement locks).
  if (open->ahead() &&
      (std::any_of(open->run.begin(), open->run.end(),
                   [](const auto& chunk) { return chunk.paused || chunk.refused; }) ||
       !importer.follow().Watches(WatchTag({open->handle.pid, open->handle.instance}))))
    return CUDA_ERROR_ALREADY_MAPPED;
  // A run mapped ahead for another device, or at a pointer this open's
  // interior rule does not give, is in the way: taken out (under this
  // placement lock), and this open goes on as a fresh one.
  if (open->reopener.in_the_way) (void)UnmapDroppedAhead(importer.DropAheadKey(open->key));
  VMMIPC_RETURN_IF_ERROR(PlaceRun(importer, open));
  VMMIPC_RETURN_IF_ERROR(MapRun(importer, open));
  RecordOpen(importer, open);
  *pointer = open->pointer();
  return CUDA_SUCCESS;
}

CUresult IpcOpenMemHandle(CUdeviceptr* pointer, const CUipcMemHandle& raw, unsigned int flags,
                          bool v2) {
  Opening open;
  if (const std::optional<CUresult> done = DecodeOpen(pointer, raw, flags, v2, &open)) return *done;
  ImportSide& importer = Importer();
  // Ahead: the worker begins no run while this open is in progress.
  AppOpenScope in_progress(importer.ahead());
  return OpenDecoded(importer, &open, pointer);
}

CUresult IpcCloseMemHandle(CUdeviceptr pointer) {
  ImportSide& importer = Importer();
  // The placement lock of the open being closed, so that its unmaps cannot
  // interleave with an open placing chunks in the same slot (import_side.h).
  std::optional<ledger::OpenKey> key;
  if (!importer.KeyToClose(pointer, &key)) return VMMIPC_REAL(IpcCloseMemHandle, pointer);
  std::unique_lock<std::mutex> placement_lock;
  if (key)
    placement_lock =
        std::unique_lock<std::mutex>(importer.placement_mutex(key->rank_slot, key->exporter.pid));
  const ledger::CloseResult closed = importer.Close(pointer);
  // Not ours (legacy memory, or one close too many): the driver decides.
  if (!closed.ours) return VMMIPC_REAL(IpcCloseMemHandle, pointer);
  stats::Count(stats::Counter::kCloses);
  // Before the stretch's last chunk goes, so that its page tables stay.
  AnchorBeforeUnmap(importer, closed.to_unmap);
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
