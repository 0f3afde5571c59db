// Ahead (VMMIPC_AHEAD=1): one announced handle's run advanced to mapped on
// the ahead worker, through the application's own steps (OpenDecoded) with
// the run's state kMappedAhead, so that it lands where the application's
// open would put it and the application's open of the same handle adopts it
// (ledger/import_table.h, RunState). Bounded per exporter, and only into the
// zone slot where the application's first open of that exporter's memory
// placed it (ledger::ImportTable::FirstSlotOf): an
// announcement says which slot its handle names, and an exporter with memory
// on several GPUs (its slots from the GPUs) names slots of other ranks;
// taking them on its word would push those ranks' own exporters out of their
// slots, to best-effort addresses. In the context the follow thread uses.
#include <cstring>
#include <vector>

#include "core/ahead.h"
#include "core/import/follow_import.h"
#include "core/import/opening.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

template <typename... Args>
void Skip(const ledger::Vmm2Handle& h, fmt::format_string<Args...> why, Args&&... args) {
  stats::Count(stats::Counter::kAnnouncementsDropped);
  VMMIPC_LOG_DEBUG("ahead: 0x{:x} of pid {} not mapped ahead: {}", h.address, h.pid,
                   fmt::format(why, std::forward<Args>(args)...));
}

}  // namespace

void MapAhead(const AheadWorker::Handle& bytes) noexcept {
  try {
    static_assert(sizeof(CUipcMemHandle) == ledger::kHandleSize);
    ImportSide& importer = Importer();
    UseFollowContext(importer);
    Opening open;
    open.advances_to = ledger::RunState::kMappedAhead;
    ledger::Vmm2Handle& h = open.handle;
    if (ledger::DecodeHandle(bytes.data(), &h) != ledger::DecodeStatus::kOk)
      return Skip(h, "not a handle this vmmipc reads");
    // The decode the application's open makes, so that the key and the
    // address it opens are the same (not forwarded: the handle is VMM2).
    CUipcMemHandle raw;
    std::memcpy(raw.reserved, bytes.data(), bytes.size());
    CUdeviceptr pointer = 0;
    if (DecodeOpen(&pointer, raw, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, true, &open))
      return Skip(h, "refused at decode");
    const ledger::ExporterId exporter{h.pid, h.instance};
    const std::optional<uint32_t> slot = importer.FirstSlotOf(exporter);
    if (!slot || *slot != h.rank_slot)
      return Skip(h, "it names rank slot {}; this process's first open of its memory placed it {}",
                  h.rank_slot, slot ? fmt::format("in slot {}", *slot) : "outside the zone");
    // At most one run past the bound: the run's size is known after the fetch.
    const ledger::AheadUse use = importer.AheadOf(exporter);
    if (use.chunks >= kMaxAheadChunksPerExporter ||
        use.bytes + h.chunk_size > kMaxAheadBytesPerExporter)
      return Skip(h, "the exporter's runs mapped ahead are at their bound");
    VMMIPC_LOG_DEBUG("ahead: mapping 0x{:x} of pid {}", h.address, h.pid);
    const CUresult result = OpenDecoded(importer, &open, &pointer);
    if (result != CUDA_SUCCESS) return Skip(h, "{}", driver::ErrorName(result));
  } catch (...) {
    stats::Count(stats::Counter::kAnnouncementsDropped);
  }
}

}  // namespace vmmipc::core
