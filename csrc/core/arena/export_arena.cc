// Export-arena reservation and carving through the real driver.
#include "core/arena/export_arena.h"

#include <cuda.h>

#include <atomic>

#include "common/log.h"
#include "config/params.h"
#include "core/hooks.h"
#include "core/real.h"

namespace vmmipc::core {
namespace {

// What the granularity is taken to be when the driver cannot say (no current
// context, say): 2 MiB, minimum and recommended on the GPUs vmmipc targets
// (measured), and what config requires of the arena's base and size.
constexpr uint64_t kFallbackGranularity = 2ull << 20;

// The driver's VMM granularity for the current device: carves must be sizes
// and alignments the driver maps, whatever the GPU. Asked until the driver
// answers, then kept (the GPUs of one host share it).
uint64_t Granularity() {
  static std::atomic<uint64_t> known{0};
  if (const uint64_t granularity = known.load(std::memory_order_relaxed)) return granularity;
  CUdevice device = 0;
  size_t granularity = 0;
  CUresult result = VMMIPC_REAL(CtxGetDevice, &device);
  if (result == CUDA_SUCCESS) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    result = VMMIPC_REAL(MemGetAllocationGranularity, &granularity, &prop,
                         CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  }
  if (result != CUDA_SUCCESS || granularity == 0 || (granularity & (granularity - 1)) != 0) {
    VMMIPC_LOG_DEBUG("arena: the driver gave no VMM granularity ({}, {}); using {}",
                     driver::ErrorName(result), granularity, log::Bytes(kFallbackGranularity));
    return kFallbackGranularity;
  }
  known.store(granularity, std::memory_order_relaxed);
  return granularity;
}

// Reserves the arena, on first use (under the arena's lock, ArenaSide::Take).
// The layout was settled by config::Parse (the arena fits one slot, overlaps
// neither zone, ends below the top of user space, or is off), so only the
// driver can refuse.
std::optional<ArenaSide::Region> ReserveArena() {
  const config::Params& p = config::Get();
  CUdeviceptr got = 0;
  CUresult result = VMMIPC_REAL(MemAddressReserve, &got, p.arena_size, 0, p.arena_base, 0);
  if (result != CUDA_SUCCESS || got != p.arena_base) {
    // The address is only a hint to the driver: a moved arena is no arena.
    if (result == CUDA_SUCCESS) (void)VMMIPC_REAL(MemAddressFree, got, p.arena_size);
    VMMIPC_LOG_WARN(
        "export arena off: cannot reserve {} at 0x{:x} ({}); this "
        "process's own addresses may differ between runs",
        log::Bytes(p.arena_size), p.arena_base,
        result == CUDA_SUCCESS ? "the address is taken" : driver::ErrorName(result));
    return std::nullopt;
  }
  VMMIPC_LOG_INFO("export arena at 0x{:x}: {}", got, log::Bytes(p.arena_size));
  return ArenaSide::Region{got, p.arena_size};
}

bool ArenaApplies(CUdeviceptr address, unsigned long long flags) {
  return config::Get().arena_wanted() && address == 0 && flags == 0;
}

}  // namespace

CUresult MemAddressReserve(CUdeviceptr* pointer, size_t size, size_t alignment, CUdeviceptr address,
                           unsigned long long flags) {
  ArenaSide& arena = Arena();
  const bool power_of_two = (alignment & (alignment - 1)) == 0;
  if (pointer == nullptr || size == 0 || !power_of_two || !ArenaApplies(address, flags))
    return VMMIPC_REAL(MemAddressReserve, pointer, size, alignment, address, flags);
  // Asked only here, once the arena applies: other reservations cost no driver question.
  const uint64_t granularity = Granularity();
  if (size % granularity != 0)
    return VMMIPC_REAL(MemAddressReserve, pointer, size, alignment, address, flags);
  const uint64_t align = alignment > granularity ? alignment : granularity;
  if (std::optional<uint64_t> carved = arena.Take(size, align, ReserveArena)) {
    *pointer = *carved;
    VMMIPC_LOG_DEBUG("arena: reserved {} at 0x{:x}", log::Bytes(size), *pointer);
    return CUDA_SUCCESS;
  }
  return VMMIPC_REAL(MemAddressReserve, pointer, size, alignment, address, flags);
}

CUresult MemAddressFree(CUdeviceptr pointer, size_t size) {
  switch (Arena().Give(pointer, size)) {
    case ArenaSide::Freed::kFreed:
      return CUDA_SUCCESS;
    case ArenaSide::Freed::kNotACarve:
      VMMIPC_LOG_WARN("cuMemAddressFree(0x{:x}, 0x{:x}): not a reservation of the export arena",
                      pointer, size);
      return CUDA_ERROR_INVALID_VALUE;
    case ArenaSide::Freed::kNotInArena:
      break;
  }
  return VMMIPC_REAL(MemAddressFree, pointer, size);
}

bool FindArenaCarve(uint64_t address, ArenaCarveInfo* info) { return Arena().Find(address, info); }

}  // namespace vmmipc::core
