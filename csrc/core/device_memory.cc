// Allocation properties of device memory (no driver call).
#include "core/device_memory.h"

namespace vmmipc::core {

int32_t DeviceOf(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return -1;
  return prop->location.id;
}

CUmemAllocationProp DeviceMemoryProp(int32_t device, bool posix_fd) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (posix_fd) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace vmmipc::core
