// Simulated CUDA driver: initialisation, version, devices, primary contexts, error strings.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sim_state.h"

using simcuda::St;
using simcuda::State;

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

// Every code the simulator returns, plus a few a caller may pass in. Texts as the real driver's.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* FindError(CUresult code) {
  for (const ErrorText& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  simcuda::LoadEnvironment(s);
  if (s.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  s.initialized = true;
  // Once per process, as the driver registers its teardown at its initialization.
  static const bool teardown = std::atexit(simcuda::TearDownAtExit) == 0;
  (void)teardown;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = simcuda::kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  // The real driver sets *str = NULL for codes it does not know; a string is kinder to callers
  // that print it unchecked, and the return value still says the code is unknown.
  *str = e != nullptr ? e->name : "CUDA_ERROR_UNRECOGNIZED";
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->text : "unrecognized error code (simulated driver)";
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* count) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGetCount"); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGet"); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGetAttribute"); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGetName"); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "vmmipc simulated device");
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceTotalMem"); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = s.total_mem;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGetUuid"); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  static constexpr char kBase[16] = {'v', 'm', 'm', 'i', 'p', 'c', '-', 's',
                                     'i', 'm', '-', 'g', 'p', 'u', '-', '0'};
  std::memcpy(uuid->bytes, kBase, sizeof(kBase));
  uuid->bytes[15] = static_cast<char>('0' + s.host_index[dev]);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceGetPCIBusId"); r != CUDA_SUCCESS) return r;
  if (bus_id == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  // The real driver's spelling: an 8-digit domain, upper-case hex.
  std::snprintf(bus_id, static_cast<size_t>(len), "00000000:%02X:00.0", 0x10 + s.host_index[dev]);
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can_access, CUdevice dev, CUdevice peer) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDeviceCanAccessPeer"); r != CUDA_SUCCESS) return r;
  if (can_access == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev) || !simcuda::ValidDevice(s, peer)) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *can_access = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDevicePrimaryCtxRetain"); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++s.ctx_retains[dev];
  *ctx = &s.primary_ctx[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuDevicePrimaryCtxRelease"); r != CUDA_SUCCESS) return r;
  if (!simcuda::ValidDevice(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (s.ctx_retains[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --s.ctx_retains[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuCtxSetCurrent(CUcontext ctx) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxSetCurrent"); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && (ctx < &s.primary_ctx[0] || ctx >= &s.primary_ctx[s.device_count])) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  simcuda::CurrentCtx() = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxGetCurrent"); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = simcuda::CurrentCtx();
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxPushCurrent"); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr || ctx < &s.primary_ctx[0] || ctx >= &s.primary_ctx[s.device_count]) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  simcuda::CtxStack().push_back(simcuda::CurrentCtx());
  simcuda::CurrentCtx() = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxPopCurrent"); r != CUDA_SUCCESS) return r;
  if (simcuda::CurrentCtx() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx != nullptr) *ctx = simcuda::CurrentCtx();
  auto& stack = simcuda::CtxStack();
  simcuda::CurrentCtx() = stack.empty() ? nullptr : stack.back();
  if (!stack.empty()) stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxGetDevice"); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int dev = simcuda::CurrentDevice(s);
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = dev;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  if (CUresult r = simcuda::Enter(s, "cuCtxSynchronize"); r != CUDA_SUCCESS) return r;
  return simcuda::CurrentDevice(s) < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

}  // extern "C"
