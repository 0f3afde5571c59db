// Map ahead (VMMIPC_PREFETCH=3): one announced handle opened on the ahead
// thread, through the application's own steps (OpenDecoded) with its record
// marked ahead, so that it lands where the application's open would put it
// and the application's open of the same handle adopts it
// (ledger/import_table.h). Bounded per exporter like prefetch; in the
// context the follow thread uses.
#include <cstring>

#include "core/import/follow_import.h"
#include "core/import/interior_handles.h"
#include "core/import/opening.h"
#include "core/prefetch.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"

namespace vmmipc::core {
namespace {

void Skip(const ledger::Vmm2Handle& h, const char* why) {
  stats::Count(stats::Counter::kAnnouncementsDropped);
  VMMIPC_LOG_DEBUG("map ahead: 0x{:x} of pid {} not opened ahead: {}", h.address, h.pid, why);
}

}  // namespace

void OpenAhead(const AheadOpens::Handle& bytes) noexcept {
  try {
    static_assert(sizeof(CUipcMemHandle) == ledger::kHandleSize);
    ImportSide& importer = Importer();
    UseFollowContext(importer);
    Opening open;
    open.ahead = true;
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
    // At most one run past the bound: the run's size is known after the fetch.
    const ledger::AheadUse use = importer.AheadOf({h.pid, h.instance});
    if (use.chunks >= kMaxPrefetchedFdsPerExporter ||
        use.bytes + h.chunk_size > kMaxPrefetchedBytesPerExporter)
      return Skip(h, "the exporter's opens ahead are at their bound");
    VMMIPC_LOG_DEBUG("map ahead: opening 0x{:x} of pid {}", h.address, h.pid);
    const CUresult result = OpenDecoded(importer, &open, &pointer);
    if (result != CUDA_SUCCESS) return Skip(h, driver::ErrorName(result));
  } catch (...) {
    stats::Count(stats::Counter::kAnnouncementsDropped);
  }
}

}  // namespace vmmipc::core
