// The importer's VMM driver calls: the zone's reservation, reservations
// anywhere, and mapping, access and unmapping of imported chunks.
#include "core/import/vmm_calls.h"

#include <initializer_list>

#include "common/log.h"
#include "common/log_limit.h"
#include "config/params.h"
#include "core/real.h"
#include "core/stats.h"

namespace vmmipc::core {
namespace {

// The lines of failed driver calls on imported memory: opens and closes
// that an application repeats at will make them (common/log_limit.h).
log::LineLimit g_mapping_lines;

template <typename... Args>
void MappingFailed(fmt::format_string<Args...> format, Args&&... args) {
  log::LogLimited(g_mapping_lines, log::Level::kWarn, "imported memory", "failed driver calls",
                  format, std::forward<Args>(args)...);
}

// Tries one base. The address is only a hint to the driver (measured: an
// occupied hint yields CUDA_SUCCESS elsewhere), so compare what came back.
bool TryReserveAt(uint64_t want, uint64_t size) {
  CUdeviceptr got = 0;
  CUresult result = VMMIPC_REAL(MemAddressReserve, &got, size, 0, want, 0);
  if (result != CUDA_SUCCESS) {
    VMMIPC_LOG_WARN("import zone: reserving {} at 0x{:x} failed: {}", log::Bytes(size), want,
                    driver::ErrorName(result));
    return false;
  }
  if (got == want) return true;
  VMMIPC_LOG_WARN("import zone: 0x{:x} is taken (the driver offered 0x{:x})", want, got);
  (void)VMMIPC_REAL(MemAddressFree, got, size);
  return false;
}

// Reserves the zone at its base, else at its fallback base.
std::optional<ledger::ZoneLayout> ReserveZone() {
  const config::Params& params = config::Get();
  ledger::ZoneLayout zone;
  zone.slots = static_cast<uint64_t>(params.zone_slots);
  zone.slot_size = params.slot_size;
  for (uint64_t base : {params.zone_base, params.zone_fallback_base}) {
    if (base == 0 || !TryReserveAt(base, zone.size())) continue;
    zone.base = base;
    VMMIPC_LOG_INFO("import zone at 0x{:x}: {} slots of {}", base, zone.slots,
                    log::Bytes(zone.slot_size));
    return zone;
  }
  VMMIPC_LOG_WARN(
      "no import zone (tried 0x{:x} and 0x{:x}): peer memory is placed best-effort, "
      "so peer addresses differ between runs (see docs/troubleshooting.md)",
      params.zone_base, params.zone_fallback_base);
  return std::nullopt;
}

}  // namespace

std::optional<ledger::ZoneLayout> ImportZone(ImportSide& importer) {
  return importer.Zone(ReserveZone);
}

CUresult ReserveAnywhere(uint64_t size, uint64_t* base) {
  CUdeviceptr got = 0;
  VMMIPC_CU_CHECK(MemAddressReserve, &got, size, 0, 0, 0);
  *base = got;
  return CUDA_SUCCESS;
}

void FreeReservation(uint64_t base, uint64_t size) {
  CUresult result = VMMIPC_REAL(MemAddressFree, base, size);
  if (result != CUDA_SUCCESS)
    MappingFailed("cuMemAddressFree(0x{:x}, 0x{:x}) failed: {}", base, size,
                  driver::ErrorName(result));
}

CUresult MapChunk(int fd, uint64_t target, uint64_t size) {
  CUmemGenericAllocationHandle handle = 0;
  // The driver does not take the fd (measured); the caller closes it.
  VMMIPC_CU_CHECK(MemImportFromShareableHandle, &handle,
                  reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  const CUresult result = VMMIPC_REAL(MemMap, target, size, 0, handle, 0);
  // The mapping keeps the memory alive after the handle is released (measured).
  (void)VMMIPC_REAL(MemRelease, handle);
  if (result != CUDA_SUCCESS)
    MappingFailed("cuMemMap(0x{:x}, 0x{:x}) of an imported chunk failed: {}", target, size,
                  driver::ErrorName(result));
  return result;
}

CUresult OpenAccess(uint64_t target, uint64_t size, CUdevice device) {
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult result = VMMIPC_REAL(MemSetAccess, target, size, &access, 1);
  if (result != CUDA_SUCCESS)
    MappingFailed("cuMemSetAccess(0x{:x}, 0x{:x}, device {}) failed: {}", target, size, device,
                  driver::ErrorName(result));
  return result;
}

void UnmapChunk(uint64_t target, uint64_t size) {
  CUresult result = VMMIPC_REAL(MemUnmap, target, size);
  if (result != CUDA_SUCCESS)
    MappingFailed("cuMemUnmap(0x{:x}, 0x{:x}) failed: {}", target, size, driver::ErrorName(result));
}

bool UnmapDroppedAhead(const ledger::CloseResult& dropped) {
  for (const ledger::MappedChunk& chunk : dropped.to_unmap)
    if (!chunk.paused) UnmapChunk(chunk.target, chunk.size);
  if (dropped.ours) stats::Count(stats::Counter::kOpensAheadDropped);
  return dropped.ours;
}

}  // namespace vmmipc::core
