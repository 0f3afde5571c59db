// Page-table anchors in the import zone: one allocation of the importer's
// own per device, mapped into each stretch a close empties.
#include "core/import/zone_anchors.h"

#include <algorithm>
#include <set>

#include "common/log.h"
#include "common/log_limit.h"
#include "config/params.h"
#include "core/device_memory.h"
#include "core/import/vmm_calls.h"
#include "core/real.h"
#include "core/stats.h"
#include "driver/status.h"
#include "ledger/zone_anchor_table.h"

namespace vmmipc::core {
namespace {

using ledger::AnchorKey;
using ledger::AnchorKeysOf;
using ledger::SlotSpan;
using ledger::Span;
using ledger::SpansOf;

// The smallest allocation the device allows (2 MiB on an H200), made once.
bool MakeAnchorMemory(int32_t device, ImportSide::AnchorMemory* memory) {
  const CUmemAllocationProp prop = DeviceMemoryProp(device, /*posix_fd=*/false);
  size_t granularity = 0;
  CUresult result = VMMIPC_REAL(MemGetAllocationGranularity, &granularity, &prop,
                                CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  // A spot is aligned to its size, so the size must be a power of two, and
  // well inside a stretch.
  if (result == CUDA_SUCCESS && (granularity == 0 || (granularity & (granularity - 1)) != 0 ||
                                 granularity > ledger::kAnchorStretch / 4)) {
    VMMIPC_LOG_INFO("zone anchors: device {} allocates in units of {} bytes; no anchors there",
                    device, granularity);
    return false;
  }
  CUmemGenericAllocationHandle handle = 0;
  if (result == CUDA_SUCCESS) result = VMMIPC_REAL(MemCreate, &handle, granularity, &prop, 0);
  if (result != CUDA_SUCCESS) {
    VMMIPC_LOG_INFO(
        "zone anchors: no memory on device {} for them ({}); opens there pay for "
        "page tables after a close empties their stretch",
        device, driver::ErrorName(result));
    return false;
  }
  memory->handle = handle;
  memory->size = granularity;
  VMMIPC_LOG_DEBUG("zone anchors: {} of device {} for page-table anchors", log::Bytes(granularity),
                   device);
  return true;
}

// Maps the anchor memory at `address` with access for `device`.
bool MapAnchor(const ImportSide::AnchorMemory& memory, uint64_t address, int32_t device) {
  CUresult result = VMMIPC_REAL(MemMap, address, memory.size, 0, memory.handle, 0);
  if (result == CUDA_SUCCESS) {
    result = OpenAccess(address, memory.size, device);
    if (result != CUDA_SUCCESS) (void)VMMIPC_REAL(MemUnmap, address, memory.size);
  }
  if (result != CUDA_SUCCESS) {
    VMMIPC_LOG_DEBUG("zone anchors: mapping one at 0x{:x} failed: {}", address,
                     driver::ErrorName(result));
    return false;
  }
  return true;
}

}  // namespace

void AnchorBeforeUnmap(ImportSide& importer, const std::vector<ledger::MappedChunk>& chunks) {
  if (!config::Get().zone_anchors || chunks.empty()) return;
  const std::optional<ledger::ZoneLayout> zone = importer.ReservedZone();
  if (!zone) return;
  std::set<AnchorKey> keys;
  for (const ledger::MappedChunk& chunk : chunks) {
    const std::optional<uint32_t> slot = zone->SlotAt(chunk.target);
    if (!slot || chunk.paused || chunk.device < 0) continue;
    keys.merge(AnchorKeysOf(*zone, *slot, {chunk}));
  }
  const std::vector<Span> unmapping = SpansOf(chunks);
  for (const AnchorKey& key : keys) {
    const Span within = ledger::StretchInSlot(key.stretch, SlotSpan(*zone, key.slot));
    // The device whose page tables the unmapped chunks used.
    int32_t device = -1;
    for (const ledger::MappedChunk& c : chunks)
      if (c.target < within.end && within.begin < c.target + c.size) device = c.device;
    std::vector<Span> busy;
    const bool wanted =
        importer.WithAnchors([&](ledger::ImportTable& table, ledger::ZoneAnchorTable& anchors) {
          if (anchors.Find(key)) return false;
          const std::vector<ledger::MappedChunk> left = table.ChunksIn(within.begin, within.end);
          if (std::any_of(left.begin(), left.end(), [](const auto& c) { return !c.paused; }))
            return false;        // something stays mapped there: so do the page tables
          busy = SpansOf(left);  // paused chunks' ranges wait for their resume
          return true;
        });
    if (!wanted || device < 0) continue;
    const std::optional<ImportSide::AnchorMemory> memory =
        importer.AnchorMemoryFor(device, MakeAnchorMemory);
    if (!memory) return;
    busy.insert(busy.end(), unmapping.begin(), unmapping.end());  // still mapped now
    const std::optional<uint64_t> spot = ledger::FreeSpot(within, memory->size, busy);
    if (!spot || !MapAnchor(*memory, *spot, device)) continue;
    importer.WithAnchors([&](ledger::ImportTable&, ledger::ZoneAnchorTable& anchors) {
      anchors.Set(key, {*spot, memory->size, device});
    });
    stats::Count(stats::Counter::kZoneAnchorsMapped);
    VMMIPC_LOG_DEBUG("zone anchors: kept the page tables of 0x{:x}+512 MiB (slot {}) at 0x{:x}",
                     key.stretch, key.slot, *spot);
  }
}

bool ClearAnchorsFor(ImportSide& importer, uint32_t slot,
                     const std::vector<ledger::MappedChunk>& chunks) {
  if (!config::Get().zone_anchors || chunks.empty()) return true;
  const std::optional<ledger::ZoneLayout> zone = importer.ReservedZone();
  if (!zone || slot >= zone->slots) return true;
  const std::vector<Span> mapping = SpansOf(chunks);
  for (const AnchorKey& key : AnchorKeysOf(*zone, slot, chunks)) {
    const Span within = ledger::StretchInSlot(key.stretch, SlotSpan(*zone, slot));
    std::optional<ledger::Anchor> anchor;
    std::vector<Span> busy;
    importer.WithAnchors([&](ledger::ImportTable& table, ledger::ZoneAnchorTable& anchors) {
      anchor = anchors.Find(key);
      if (anchor) busy = SpansOf(table.ChunksIn(within.begin, within.end));
    });
    if (!anchor) continue;
    const Span spot_now{anchor->address, anchor->address + anchor->size};
    if (std::none_of(mapping.begin(), mapping.end(), [&](const Span& m) {
          return m.begin < spot_now.end && spot_now.begin < m.end;
        }))
      continue;
    // Elsewhere in the stretch first, so that its page tables never go.
    busy.insert(busy.end(), mapping.begin(), mapping.end());
    busy.push_back(spot_now);
    const std::optional<ImportSide::AnchorMemory> memory =
        importer.AnchorMemoryFor(anchor->device, MakeAnchorMemory);
    bool moved = false;
    uint64_t moved_to = 0;
    if (memory) {
      const std::optional<uint64_t> spot = ledger::FreeSpot(within, anchor->size, busy);
      if (spot && MapAnchor(*memory, *spot, anchor->device)) {
        moved = true;
        moved_to = *spot;
      }
    }
    const CUresult unmapped = VMMIPC_REAL(MemUnmap, anchor->address, anchor->size);
    if (unmapped != CUDA_SUCCESS) {
      // The old anchor stays where it is, and in the table; the new one goes.
      if (moved) (void)VMMIPC_REAL(MemUnmap, moved_to, anchor->size);
      // Each open that needs the spot tries again: rate-limited (log_limit.h).
      static log::LineLimit lines;
      log::LogLimited(lines, log::Level::kWarn, "zone anchors", "failed anchor unmaps",
                      "zone anchors: cuMemUnmap(0x{:x}, 0x{:x}) of an anchor failed: {}",
                      anchor->address, anchor->size, driver::ErrorName(unmapped));
      return false;
    }
    importer.WithAnchors([&](ledger::ImportTable&, ledger::ZoneAnchorTable& anchors) {
      if (moved)
        anchors.Set(key, {moved_to, anchor->size, anchor->device});
      else
        anchors.Clear(key);
    });
    stats::Count(moved ? stats::Counter::kZoneAnchorsMoved : stats::Counter::kZoneAnchorsDropped);
    VMMIPC_LOG_DEBUG("zone anchors: an open needs 0x{:x}; the anchor of 0x{:x}+512 MiB {} 0x{:x}",
                     anchor->address, key.stretch, moved ? "moved to" : "dropped, was at",
                     moved ? moved_to : anchor->address);
  }
  return true;
}

}  // namespace vmmipc::core
