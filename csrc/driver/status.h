// Error plumbing of the layers that speak CUDA (driver, core, entry): CUresult
// is the one status type of the library (it is what every hooked entry point
// returns). It lives with the driver, not in common, so that the CUDA-free
// layers (common, config, ledger, transport) never see a CUDA header; their
// helpers for system calls are in common/syscall.h.
#pragma once

#include <cuda.h>

// Propagates a failed CUresult unchanged (the failure was logged where it began).
#define VMMIPC_RETURN_IF_ERROR(expr)                           \
  do {                                                         \
    const CUresult vmmipc_status_ = (expr);                    \
    if (vmmipc_status_ != CUDA_SUCCESS) return vmmipc_status_; \
  } while (0)
