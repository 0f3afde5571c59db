// The only code that knows libcuda exists: a table of the real driver's entry
// points (driver/entry_points.h), loaded once from the library core names
// (VMMIPC_CUDA_LIBRARY), never at load time. Everything in vmmipc calls the
// driver through it (core/real.h); a call by name would bind back to
// vmmipc's own hooks.
#pragma once

#include <cuda.h>

#include <string>

#include "driver/entry_points.h"

namespace vmmipc::driver {

struct RealDriver {
#define VMMIPC_DRIVER_MEMBER(symbol, member, parameters, ...) \
  CUresult(*member) parameters = nullptr;
#define VMMIPC_DRIVER_HOOK_MEMBER(symbol, member, proc, since, until, parameters, arguments) \
  VMMIPC_DRIVER_MEMBER(symbol, member, parameters)
  VMMIPC_DRIVER_ENTRY_POINTS(VMMIPC_DRIVER_MEMBER, VMMIPC_DRIVER_HOOK_MEMBER)
#undef VMMIPC_DRIVER_HOOK_MEMBER
#undef VMMIPC_DRIVER_MEMBER
  void* library = nullptr;  // dlopen handle of the real libcuda
};

// Loads the table from `library` on the first call; later calls return the
// same table whatever they pass. Never fails: when the library cannot be
// loaded, or its entry points are vmmipc's own (it would call itself
// forever), the table's entries are null and Loaded() is false.
const RealDriver& Load(const std::string& library);
// Whether a Load succeeded (false before the first one).
bool Loaded();
// What a call of a null entry point returns: CUDA_ERROR_NOT_SUPPORTED, with
// an error line when the driver loaded without it.
CUresult MissingEntryPoint(const char* member);
// Human name of a CUresult for log lines ("CUDA_ERROR_INVALID_VALUE"), from
// the loaded table (a result to name came from a call through it).
const char* ErrorName(CUresult result);

}  // namespace vmmipc::driver
