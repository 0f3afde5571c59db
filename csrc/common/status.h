// Error plumbing of the layers that speak CUDA (driver, core, entry): CUresult
// is the one status type of the library (it is what every hooked entry point
// returns). The CUDA-free helpers for system calls are in syscall.h.
#pragma once

#include <cuda.h>

#include "common/log.h"
#include "common/syscall.h"

// Propagates a failed CUresult unchanged (the failure was logged where it began).
#define VMMIPC_RETURN_IF_ERROR(expr)                             \
  do {                                                           \
    const CUresult vmmipc_status_ = (expr);                      \
    if (vmmipc_status_ != CUDA_SUCCESS) return vmmipc_status_;   \
  } while (0)
