// Allocation properties of device memory, for both sides: the device an
// allocation lives on (the cuMemMap hook records it), and the properties of
// vmmipc's own small allocations (the export keep-alive, the zone's page-table
// anchors).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace vmmipc::core {

// The device ordinal an allocation lives on, from its properties (nullptr:
// unknown); -1 for memory that is not on a device (host NUMA, say).
int32_t DeviceOf(const CUmemAllocationProp* prop);

// Pinned memory of `device`, exportable as a POSIX fd when asked: what
// vmmipc's own small allocations are made of.
CUmemAllocationProp DeviceMemoryProp(int32_t device, bool posix_fd);

}  // namespace vmmipc::core
