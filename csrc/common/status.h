// Error plumbing shared by every layer: CUresult is the one status type of the
// library (it is what every hooked entry point returns), plus helpers for
// syscalls that retry EINTR and log errno once where a failure starts.
#pragma once

#include <cuda.h>
#include <errno.h>

#include <cstring>

#include "common/log.h"

namespace vmmipc {

// Runs a syscall-like callable until it stops failing with EINTR.
template <typename Call>
auto RetryOnEintr(Call call) -> decltype(call()) {
  decltype(call()) result;
  do {
    result = call();
  } while (result == -1 && errno == EINTR);
  return result;
}

inline const char* ErrnoText(int error) { return strerrordesc_np(error) ? strerrordesc_np(error) : "unknown error"; }

}  // namespace vmmipc

// Propagates a failed CUresult unchanged (the failure was logged where it began).
#define VMMIPC_RETURN_IF_ERROR(expr)           \
  do {                                         \
    const CUresult vmmipc_status_ = (expr);    \
    if (vmmipc_status_ != CUDA_SUCCESS) return vmmipc_status_; \
  } while (0)
