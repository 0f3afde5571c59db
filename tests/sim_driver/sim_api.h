// Simulated CUDA driver: the C API surface it exports.
//
// Includes cuda.h, then declares the few legacy (unsuffixed) spellings that the real libcuda.so.1
// still exports beside their _v2 replacements. cuda.h #defines the plain names to the _v2 ones, so
// they are #undef'd here; after this header, `cuIpcOpenMemHandle` etc. name the v1 symbols and the
// _v2 spellings must be written out.
#ifndef VMMIPC_TESTS_SIM_DRIVER_SIM_API_H_
#define VMMIPC_TESTS_SIM_DRIVER_SIM_API_H_

#include <cuda.h>

#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
#undef cuMemGetAddressRange
#undef cuDevicePrimaryCtxRelease
#undef cuDeviceGetUuid

extern "C" {
// v1: same C signature as cuIpcOpenMemHandle_v2.
CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags);
// v1: no symbolStatus argument.
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
// v1: 32-bit pointers and sizes; the simulator answers CUDA_ERROR_NOT_SUPPORTED.
CUresult cuMemGetAddressRange(unsigned int* pbase, unsigned int* psize, unsigned int dptr);
// v1: same C signature as cuDevicePrimaryCtxRelease_v2.
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
// v1: same C signature as cuDeviceGetUuid_v2.
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
}

#endif  // VMMIPC_TESTS_SIM_DRIVER_SIM_API_H_
