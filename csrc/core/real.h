// core's one way to the real driver and to libc's dlsym: the table of
// driver/real_driver.h, loaded on first use from VMMIPC_CUDA_LIBRARY (config
// reaches the driver layer only through here), the macros every call of a
// real entry point goes through, and the two questions entry asks of the
// driver (is this handle libcuda's; libc's own dlsym). entry includes this,
// never driver/ (docs/architecture.md: entry -> core -> driver).
#pragma once

#include <cuda.h>

#include "common/exit_gate.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "driver/real_driver.h"
#include "driver/real_symbols.h"

namespace vmmipc::core {

// The real driver's table, loaded on the first call. Never null; its entries
// are null when the driver could not be loaded (DriverLoaded() false).
const driver::RealDriver& Real();
bool DriverLoaded();
// True if `handle` is the dlopen handle of the loaded real driver. Loads
// nothing: before the program loads the driver no handle can be its.
bool IsDriverHandle(void* handle);
// libc's dlsym and dlvsym, past vmmipc's own exports (driver/real_symbols.h).
using driver::RealDlsym;
using driver::RealDlvsym;

// A driver call of one of vmmipc's threads, made only while the exit gate is
// open (VMMIPC_REAL).
template <typename Call>
CUresult PastExitGate(Call call) {
  ExitGatePass pass;
  return pass.open() ? call() : CUDA_ERROR_DEINITIALIZED;
}

// A status the exit gate made (not the driver): nothing to warn about.
inline bool RefusedAtExit(CUresult status) {
  return status == CUDA_ERROR_DEINITIALIZED && ExitGateClosed() && OnVmmipcThread();
}

}  // namespace vmmipc::core

// Calls a real driver function that might be missing from an old libcuda:
// a missing entry point is CUDA_ERROR_NOT_SUPPORTED, never a null call. On
// one of vmmipc's own threads the call passes the exit gate
// (common/exit_gate.h): once the process exits it is not made, and answers
// CUDA_ERROR_DEINITIALIZED.
#define VMMIPC_REAL(member, ...)                                                           \
  (::vmmipc::core::Real().member == nullptr ? ::vmmipc::driver::MissingEntryPoint(#member) \
   : !::vmmipc::OnVmmipcThread()                                                           \
       ? ::vmmipc::core::Real().member(__VA_ARGS__)                                        \
       : ::vmmipc::core::PastExitGate([&] { return ::vmmipc::core::Real().member(__VA_ARGS__); }))

// Logs one line naming the failed driver call and returns its CUresult (no
// line for a call the exit gate kept from the driver). The line is
// rate-limited per call site (common/log_limit.h): a caller that retries,
// say, an open whose import fails must not flood the log.
#define VMMIPC_CU_CHECK(member, ...)                                                         \
  do {                                                                                       \
    const CUresult vmmipc_cu_status_ = VMMIPC_REAL(member, __VA_ARGS__);                     \
    if (vmmipc_cu_status_ != CUDA_SUCCESS) {                                                 \
      if (::vmmipc::core::RefusedAtExit(vmmipc_cu_status_)) return vmmipc_cu_status_;        \
      static ::vmmipc::log::LineLimit vmmipc_cu_lines_;                                      \
      ::vmmipc::log::LogLimited(vmmipc_cu_lines_, ::vmmipc::log::Level::kWarn, "cu" #member, \
                                "failures", "{} failed: {} ({}:{})", #member,                \
                                ::vmmipc::driver::ErrorName(vmmipc_cu_status_), __FILE__,    \
                                __LINE__);                                                   \
      return vmmipc_cu_status_;                                                              \
    }                                                                                        \
  } while (0)
