// The hooks around allocation and mapping of the process's own VMM memory:
//  - cuMemCreate asks for POSIX-fd export on device memory, so that memory a
//    program made without it can still be shared, and gives each new chunk a
//    generation; cuMemRelease drops it.
//  - cuMemMap records each mapping (with everything get will need) so that
//    get makes no driver call; cuMemUnmap takes the records out before the
//    driver unmaps. With follow on, both tell the importers (core/follow.h);
//    with the background export on, cuMemMap queues the chunk for it, and
//    both are busy work that pauses it (an export beside a map or an unmap
//    slows the application's allocation: a memory saver's resume or pause).
#include "common/log.h"
#include "config/params.h"
#include "core/device_memory.h"
#include "core/export/export_ahead.h"
#include "core/export/vmm_memory.h"
#include "core/follow.h"
#include "core/hooks.h"
#include "core/process_state.h"
#include "core/real.h"

namespace vmmipc::core {

CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags) {
  const bool widen = prop != nullptr && config::Get().force_posix_fd &&
                     prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                     (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0;
  CUresult result;
  if (widen) {
    CUmemAllocationProp widened = *prop;
    widened.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
        widened.requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    result = VMMIPC_REAL(MemCreate, handle, size, &widened, flags);
    // Some allocation kinds may refuse the extra type: then behave as asked.
    if (result != CUDA_SUCCESS && result != CUDA_ERROR_OUT_OF_MEMORY) {
      VMMIPC_LOG_DEBUG("cuMemCreate with POSIX fd export added failed ({}); retrying as asked",
                       driver::ErrorName(result));
      result = VMMIPC_REAL(MemCreate, handle, size, prop, flags);
    }
  } else {
    result = VMMIPC_REAL(MemCreate, handle, size, prop, flags);
  }
  if (result == CUDA_SUCCESS && handle != nullptr) State().exporter.generations().OnCreate(*handle);
  return result;
}

CUresult MemRelease(CUmemGenericAllocationHandle handle) {
  const CUresult result = VMMIPC_REAL(MemRelease, handle);
  if (result == CUDA_SUCCESS) State().exporter.generations().OnRelease(handle);
  return result;
}

CUresult MemMap(CUdeviceptr pointer, size_t size, size_t offset,
                CUmemGenericAllocationHandle handle, unsigned long long flags) {
  BusyScope busy(BackgroundIfOn());
  const CUresult result = VMMIPC_REAL(MemMap, pointer, size, offset, handle, flags);
  if (result != CUDA_SUCCESS) return result;
  // Everything get will need, asked once here (a map costs far more anyway).
  ledger::VmmMapping mapping;
  mapping.base = pointer;
  mapping.size = size;
  mapping.offset = offset;
  CUmemAllocationProp prop = {};
  const bool have_props =
      VMMIPC_REAL(MemGetAllocationPropertiesFromHandle, &prop, handle) == CUDA_SUCCESS;
  mapping.posix_fd_exportable =
      have_props && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  mapping.device = DeviceOf(have_props ? &prop : nullptr);
  if (ExportRegionOf(pointer, &mapping.region_base, &mapping.region_end) != CUDA_SUCCESS) {
    mapping.region_base = pointer;  // no reservation answer: the mapping is its own region
    mapping.region_end = pointer + size;
  }
  ProcessState& state = State();
  mapping.generation = state.exporter.mappings().Add(mapping);
  if (config::Get().follow) FollowMap(state, mapping);  // a resume: importers map it too
  // Off every caller's path from here on: exported by the background export's
  // thread (core/export/background_export.h), before any get.
  if (config::Get().background_export) ExportInBackground(state.exporter, mapping);
  return result;
}

CUresult MemUnmap(CUdeviceptr pointer, size_t size) {
  // The records go first, so that no request being served can see a mapping
  // whose memory the driver has already taken away (a torn run), and a new
  // mapping made at the same place by another thread right after the driver's
  // unmap is never erased by this one's late bookkeeping.
  BusyScope busy(BackgroundIfOn());
  ProcessState& state = State();
  ledger::TakenMappings taken = state.exporter.mappings().Take(pointer, size);
  // A pause: importers that hold these chunks unmap them first (follow).
  const bool follow = config::Get().follow;
  if (follow) FollowUnmap(state, taken);
  const CUresult result = VMMIPC_REAL(MemUnmap, pointer, size);
  if (result == CUDA_SUCCESS) SayUnfollowedUnmap(taken);
  if (result != CUDA_SUCCESS) {
    state.exporter.mappings().Restore(taken.records);
    // The memory is still here: importers that followed the pause map it again.
    if (follow)
      for (const ledger::VmmMapping& record : taken.records) FollowMap(state, record);
  }
  // The cached exported fds close here, outside the table's lock. The last
  // one of the process may cost the driver's export teardown
  // (docs/driver-behaviour.md#export-cliff).
  return result;
}

}  // namespace vmmipc::core
