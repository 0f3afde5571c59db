// Tests of the simulated CUDA driver (label: sim): each measured real-driver behaviour it must
// reproduce (docs/driver-behaviour.md), memory reaching another process through an exported fd and
// through a legacy IPC handle, and that nothing leaks.
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sim_introspect.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kChunk = 2 * kMiB;
constexpr uint64_t kTiB = uint64_t{1} << 40;

#define ASSERT_CU(expr) ASSERT_EQ(CUDA_SUCCESS, (expr))
#define EXPECT_CU(expr) EXPECT_EQ(CUDA_SUCCESS, (expr))

CUmemAllocationProp Prop(int device = 0, bool posix = true) {
  CUmemAllocationProp p;
  std::memset(&p, 0, sizeof(p));
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes =
      posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

CUmemAccessDesc Access(int device, CUmemAccess_flags flags) {
  CUmemAccessDesc d;
  std::memset(&d, 0, sizeof(d));
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = flags;
  return d;
}

CUresult SetRW(CUdeviceptr p, size_t n, int device = 0) {
  CUmemAccessDesc d = Access(device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  return cuMemSetAccess(p, n, &d, 1);
}

SimCudaStats Stats() {
  SimCudaStats s;
  std::memset(&s, 0, sizeof(s));
  simcuda_get_stats(&s);
  return s;
}

bool SameStats(const SimCudaStats& a, const SimCudaStats& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

std::string Describe(const SimCudaStats& s) {
  std::ostringstream o;
  o << "alloc=" << s.live_allocations << " maps=" << s.mappings << " res=" << s.reservations
    << " legacy=" << s.legacy_allocations << " imports=" << s.legacy_imports
    << " fds=" << s.open_fds;
  return o.str();
}

// The permission string ("rw-s", "---p") of the /proc/self/maps line holding addr; "" if none.
std::string Perms(uintptr_t addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &lo, &hi, perms) == 3 && addr >= lo &&
        addr < hi) {
      return perms;
    }
  }
  return "";
}

// Runs fn in a forked child; returns its exit code (128 + signal if it died of one). The child
// inherits the simulator's state and the calling thread's current context.
int InChild(const std::function<int()>& fn) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 255;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// dlsym on the simulator's own handle (the library these tests link).
void* Sym(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* p = dlsym(lib, name);
  dlclose(lib);
  return p;
}

// Initialises the driver, makes device 0's primary context current, and checks on the way out
// that the test left the simulator holding exactly what it held before.
class SimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    simcuda_clear_failures();
    baseline_ = Stats();
  }
  void TearDown() override {
    SimCudaStats now = Stats();
    EXPECT_TRUE(SameStats(baseline_, now))
        << "leak: before " << Describe(baseline_) << ", after " << Describe(now);
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  }

  // A mapped, read-write chunk of `size` bytes in its own reservation.
  struct Chunk {
    CUdeviceptr ptr = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
  };
  Chunk MakeChunk(size_t size, bool posix = true) {
    Chunk c;
    c.size = size;
    CUmemAllocationProp p = Prop(0, posix);
    EXPECT_CU(cuMemCreate(&c.handle, size, &p, 0));
    EXPECT_CU(cuMemAddressReserve(&c.ptr, size, 0, 0, 0));
    EXPECT_CU(cuMemMap(c.ptr, size, 0, c.handle, 0));
    EXPECT_CU(SetRW(c.ptr, size));
    return c;
  }
  void FreeChunk(const Chunk& c) {
    EXPECT_CU(cuMemUnmap(c.ptr, c.size));
    EXPECT_CU(cuMemAddressFree(c.ptr, c.size));
    EXPECT_CU(cuMemRelease(c.handle));
  }

  CUcontext ctx_ = nullptr;
  SimCudaStats baseline_{};
};

// ---------------------------------------------------------------------------------------------
// Initialisation (each in a fresh process: threadsafe death tests re-execute the binary).

// Each returns a bit mask of failed checks (0: all passed).
int CheckCallsBeforeInit() {
  int bad = 0, count = -1, version = 0;
  void* fn = nullptr;
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  CUdeviceptr d = 0;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) bad |= 1;
  if (cuMemCreate(&h, kChunk, &p, 0) != CUDA_ERROR_NOT_INITIALIZED) bad |= 2;
  if (cuMemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) bad |= 4;
  if (cuDriverGetVersion(&version) != CUDA_SUCCESS || version != 13000) bad |= 8;
  if (cuGetProcAddress("cuInit", &fn, 13000, 0, nullptr) != CUDA_SUCCESS) bad |= 16;
  if (cuInit(1) != CUDA_ERROR_INVALID_VALUE) bad |= 32;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS || count != 1) {
    bad |= 64;
  }
  return bad;
}

int CheckZeroDevices() {
  setenv("SIMCUDA_DEVICE_COUNT", "0", 1);
  int bad = 0, count = -1;
  if (cuInit(0) != CUDA_ERROR_NO_DEVICE) bad |= 1;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) bad |= 2;
  if (cuInit(0) != CUDA_ERROR_NO_DEVICE) bad |= 4;
  return bad;
}

int CheckEnvironment() {
  setenv("SIMCUDA_DEVICE_COUNT", "2", 1);
  setenv("SIMCUDA_FAIL", "cuMemAddressReserve:2:2,garbage,cuMemCreate:x:1", 1);
  int bad = 0, count = 0;
  CUdevice dev = -1;
  CUdeviceptr a = 0, b = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS || count != 2) {
    bad |= 1;
  }
  if (cuDeviceGet(&dev, 1) != CUDA_SUCCESS || dev != 1) bad |= 2;
  if (cuDeviceGet(&dev, 2) != CUDA_ERROR_INVALID_DEVICE) bad |= 4;
  CUmemAllocationProp p1 = Prop(1), p2 = Prop(2);
  CUmemGenericAllocationHandle h = 0;
  if (cuMemCreate(&h, kChunk, &p2, 0) != CUDA_ERROR_INVALID_DEVICE) bad |= 8;
  if (cuMemCreate(&h, kChunk, &p1, 0) != CUDA_SUCCESS) bad |= 16;
  // The second reservation fails as injected; the third works again.
  if (cuMemAddressReserve(&a, kChunk, 0, 0, 0) != CUDA_SUCCESS) bad |= 32;
  if (cuMemAddressReserve(&b, kChunk, 0, 0, 0) != CUDA_ERROR_OUT_OF_MEMORY) bad |= 64;
  if (cuMemAddressReserve(&b, kChunk, 0, 0, 0) != CUDA_SUCCESS) bad |= 128;
  // Both devices may be granted access; the chunk's device is reported.
  CUmemAccessDesc both[2] = {Access(0, CU_MEM_ACCESS_FLAGS_PROT_READ),
                             Access(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  int ordinal = -1;
  if (cuMemMap(a, kChunk, 0, h, 0) != CUDA_SUCCESS || cuMemSetAccess(a, kChunk, both, 2) != 0 ||
      cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a) != CUDA_SUCCESS ||
      ordinal != 1) {
    bad |= 256;
  }
  return bad;
}

TEST(SimInitDeathTest, CallsBeforeCuInitFailButVersionAndProcAddressWork) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(CheckCallsBeforeInit()), ::testing::ExitedWithCode(0), "");
}

TEST(SimInitDeathTest, ZeroDevicesBehavesAsNoGpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(CheckZeroDevices()), ::testing::ExitedWithCode(0), "");
}

TEST(SimInitDeathTest, DeviceCountAndFaultsFromEnvironment) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(CheckEnvironment()), ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------------------------
// Devices, contexts, errors, cuGetProcAddress.

TEST_F(SimTest, DeviceAttributesNameAndGranularity) {
  auto attr = [](CUdevice_attribute a) {
    int v = -1;
    EXPECT_CU(cuDeviceGetAttribute(&v, a, 0));
    return v;
  };
  EXPECT_EQ(1, attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED));
  EXPECT_EQ(1, attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
  EXPECT_EQ(1, attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED));
  EXPECT_EQ(9, attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
  EXPECT_EQ(0, attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  EXPECT_EQ(0, attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED));
  int v = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE,
            cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1));

  char name[64];
  ASSERT_CU(cuDeviceGetName(name, sizeof(name), 0));
  EXPECT_STREQ("vmmipc simulated device", name);
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem(&total, 0));
  EXPECT_GT(total, size_t{1} << 30);
  CUdevice dev = -1;
  ASSERT_CU(cuCtxGetDevice(&dev));
  EXPECT_EQ(0, dev);

  CUmemAllocationProp p = Prop();
  size_t g = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(kChunk, g);
  ASSERT_CU(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(kChunk, g);
}

TEST_F(SimTest, ErrorNamesAndStrings) {
  const CUresult codes[] = {CUDA_SUCCESS,
                            CUDA_ERROR_INVALID_VALUE,
                            CUDA_ERROR_OUT_OF_MEMORY,
                            CUDA_ERROR_NOT_INITIALIZED,
                            CUDA_ERROR_NO_DEVICE,
                            CUDA_ERROR_INVALID_DEVICE,
                            CUDA_ERROR_INVALID_CONTEXT,
                            CUDA_ERROR_NOT_FOUND,
                            CUDA_ERROR_NOT_PERMITTED,
                            CUDA_ERROR_NOT_SUPPORTED,
                            CUDA_ERROR_OPERATING_SYSTEM,
                            CUDA_ERROR_UNKNOWN};
  for (CUresult c : codes) {
    const char* n = nullptr;
    const char* s = nullptr;
    EXPECT_CU(cuGetErrorName(c, &n));
    EXPECT_CU(cuGetErrorString(c, &s));
    ASSERT_NE(nullptr, n);
    ASSERT_NE(nullptr, s);
    EXPECT_EQ(0, std::strncmp(n, "CUDA_", 5)) << n;
  }
  const char* n = nullptr;
  EXPECT_CU(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &n));
  EXPECT_STREQ("CUDA_ERROR_INVALID_VALUE", n);
  const char* s = nullptr;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuGetErrorString(static_cast<CUresult>(123456), &s));
  ASSERT_NE(nullptr, s);  // the generic fallback
}

TEST_F(SimTest, CurrentContextIsPerThread) {
  CUcontext cur = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&cur));
  EXPECT_EQ(ctx_, cur);
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, kChunk, &p, 0));
  std::thread([&] {
    CUcontext c = ctx_;
    EXPECT_CU(cuCtxGetCurrent(&c));
    EXPECT_EQ(nullptr, c);
    CUdevice dev = 0;
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetDevice(&dev));
    CUdeviceptr d = 0;
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&d, 4096));
    // Measured: export works on a fresh thread with no current context.
    int fd = -1;
    EXPECT_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    EXPECT_GE(fd, 0);
    close(fd);
    EXPECT_CU(cuCtxPushCurrent(ctx_));
    EXPECT_CU(cuCtxGetDevice(&dev));
    CUcontext popped = nullptr;
    EXPECT_CU(cuCtxPopCurrent(&popped));
    EXPECT_EQ(ctx_, popped);
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetDevice(&dev));
  }).join();
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(reinterpret_cast<CUcontext>(&p)));
  EXPECT_CU(cuMemRelease(h));
}

TEST_F(SimTest, GetProcAddressResolvesByBaseNameAndVersion) {
  struct Row {
    const char* ask;
    int version;
    const char* expect;
  };
  const Row rows[] = {
      {"cuIpcOpenMemHandle", 4010, "cuIpcOpenMemHandle"},  // measured
      {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2"},
      {"cuIpcOpenMemHandle", 13000, "cuIpcOpenMemHandle_v2"},
      {"cuGetProcAddress", 11030, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
      {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2"},
      {"cuMemGetAddressRange", 2000, "cuMemGetAddressRange"},
      {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
      {"cuMemFree", 13000, "cuMemFree_v2"},
      {"cuMemcpyHtoD", 12000, "cuMemcpyHtoD_v2"},
      {"cuMemsetD32", 12000, "cuMemsetD32_v2"},
      {"cuDeviceTotalMem", 12000, "cuDeviceTotalMem_v2"},
      {"cuDevicePrimaryCtxRelease", 10000, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
      {"cuMemCreate", 12000, "cuMemCreate"},
      {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle"},
      {"cuInit", 13000, "cuInit"},
  };
  for (const Row& r : rows) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    ASSERT_CU(cuGetProcAddress(r.ask, &fn, r.version, 0, &st)) << r.ask << "@" << r.version;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, st);
    void* want = Sym(r.expect);
    ASSERT_NE(nullptr, want) << r.expect << " is not exported";
    EXPECT_EQ(want, fn) << r.ask << "@" << r.version << " should be " << r.expect;
  }
  for (const char* name :
       {"cuIpcOpenMemHandle_v2", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuNoSuchFunction", ""}) {
    int dummy = 0;
    void* fn = &dummy;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuGetProcAddress(name, &fn, 13000, 0, &st)) << name;
    EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, st) << name;
    EXPECT_EQ(nullptr, fn);
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuGetProcAddress("cuMemCreate", &fn, 10000, 0, &st));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, st);

  // The v1 entry point (4 arguments), as libcudart reaches it, and what it returns is callable.
  using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<GetProcV1>(Sym("cuGetProcAddress"));
  ASSERT_NE(nullptr, v1);
  ASSERT_CU(v1("cuDriverGetVersion", &fn, 12000, 0));
  int version = 0;
  ASSERT_CU(reinterpret_cast<CUresult (*)(int*)>(fn)(&version));
  EXPECT_EQ(13000, version);
  using RangeV1 = CUresult (*)(unsigned int*, unsigned int*, unsigned int);
  auto range_v1 = reinterpret_cast<RangeV1>(Sym("cuMemGetAddressRange"));
  ASSERT_NE(nullptr, range_v1);
  unsigned int b = 0, sz = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, range_v1(&b, &sz, 0));
}

// ---------------------------------------------------------------------------------------------
// VMM: create, reserve, map, access.

TEST_F(SimTest, MemCreateValidation) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, kChunk + 4096, &p, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 0, &p, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, kChunk, nullptr, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, kChunk, &p, 1));
  CUmemAllocationProp bad = p;
  bad.type = CU_MEM_ALLOCATION_TYPE_MANAGED;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, kChunk, &bad, 0));
  bad = p;
  bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, kChunk, &bad, 0));
  bad = p;
  bad.location.id = 7;
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h, kChunk, &bad, 0));
  bad = p;
  bad.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;  // measured: no IMEX channel
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemCreate(&h, kChunk, &bad, 0));
  bad.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
      CU_MEM_HANDLE_TYPE_FABRIC | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED, cuMemCreate(&h, kChunk, &bad, 0));
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem(&total, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, total + kChunk, &p, 0));

  CUmemGenericAllocationHandle h1 = 0, h2 = 0;
  ASSERT_CU(cuMemCreate(&h1, kChunk, &p, 0));
  ASSERT_CU(cuMemCreate(&h2, 2 * kChunk, &p, 0));
  EXPECT_NE(h1, h2);
  EXPECT_NE(0u, h1);
  CUmemAllocationProp got;
  ASSERT_CU(cuMemGetAllocationPropertiesFromHandle(&got, h1));
  EXPECT_EQ(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, got.requestedHandleTypes);
  EXPECT_EQ(CU_MEM_LOCATION_TYPE_DEVICE, got.location.type);
  EXPECT_EQ(Stats().live_allocations, baseline_.live_allocations + 2);
  EXPECT_CU(cuMemRelease(h1));
  EXPECT_CU(cuMemRelease(h2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemGetAllocationPropertiesFromHandle(&got, h2));
}

TEST_F(SimTest, ReserveHintHonouredMovedOrIgnored) {
  // Measured: 1 TiB at 0x300000000000 is granted exactly.
  const CUdeviceptr hint = 0x300000000000ULL;
  CUdeviceptr big = 0;
  ASSERT_CU(cuMemAddressReserve(&big, kTiB, 0, hint, 0));
  EXPECT_EQ(hint, big);
  EXPECT_EQ("---p", Perms(big + kTiB / 2));
  // A hint inside a reserved range: success, somewhere else.
  CUdeviceptr moved = 0;
  ASSERT_CU(cuMemAddressReserve(&moved, 64 * kMiB, 0, hint + kTiB / 2, 0));
  EXPECT_NE(hint + kTiB / 2, moved);
  EXPECT_TRUE(moved + 64 * kMiB <= big || moved >= big + kTiB);
  // Measured quirk: small reservations ignore a free hint; 64 MiB honours it.
  const CUdeviceptr free_hint = 0x320000000000ULL;
  CUdeviceptr small = 0, exact = 0;
  ASSERT_CU(cuMemAddressReserve(&small, kChunk, 0, free_hint, 0));
  EXPECT_NE(free_hint, small);
  ASSERT_CU(cuMemAddressReserve(&exact, 64 * kMiB, 0, free_hint, 0));
  EXPECT_EQ(free_hint, exact);
  // Measured: a hint that cannot fit below the top of the user address space.
  CUdeviceptr top = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAddressReserve(&top, kTiB, 0, 0x7f0000000000ULL, 0));
  // Sizes must be granular; alignment is honoured and must be a power of two.
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&p, 3 * kMiB, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&p, 0, 0, 0, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&p, kChunk, 3 * kMiB, 0, 0));
  CUdeviceptr aligned = 0;
  ASSERT_CU(cuMemAddressReserve(&aligned, 2 * kChunk, size_t{1} << 30, 0, 0));
  EXPECT_EQ(0u, aligned % (size_t{1} << 30));
  // Free must name exactly a reservation.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(big, kTiB / 2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(big + kChunk, kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(0x1000, kChunk));
  EXPECT_CU(cuMemAddressFree(big, kTiB));
  EXPECT_EQ("", Perms(big + kTiB / 2));
  EXPECT_CU(cuMemAddressFree(moved, 64 * kMiB));
  EXPECT_CU(cuMemAddressFree(small, kChunk));
  EXPECT_CU(cuMemAddressFree(exact, 64 * kMiB));
  EXPECT_CU(cuMemAddressFree(aligned, 2 * kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(aligned, 2 * kChunk));
}

TEST_F(SimTest, MapThenSetAccessThenReadWrite) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAddressReserve(&base, 8 * kMiB, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, 4 * kMiB, &p, 0));
  ASSERT_CU(cuMemMap(base, 4 * kMiB, 0, h, 0));
  // Not accessible until cuMemSetAccess.
  EXPECT_EQ("---s", Perms(base));
  const char msg[] = "hello from the host";
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(base, msg, sizeof(msg)));
  ASSERT_CU(SetRW(base, 4 * kMiB));
  EXPECT_EQ("rw-s", Perms(base + 3 * kMiB));
  unsigned long long flags = 0;
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_CU(cuMemGetAccess(&flags, &loc, base + kMiB));
  EXPECT_EQ(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, flags);

  ASSERT_CU(cuMemcpyHtoD(base + 100, msg, sizeof(msg)));
  EXPECT_STREQ(msg, reinterpret_cast<const char*>(base + 100));  // a host address, too
  reinterpret_cast<char*>(base)[3 * kMiB] = 'x';
  char back = 0;
  ASSERT_CU(cuMemcpyDtoH(&back, base + 3 * kMiB, 1));
  EXPECT_EQ('x', back);
  ASSERT_CU(cuMemsetD32(base + kChunk, 0xA5A5A5A5u, 16));
  ASSERT_CU(cuMemcpyDtoD(base + 8, base + kChunk, 64));
  EXPECT_EQ(0xA5A5A5A5u, *reinterpret_cast<uint32_t*>(base + 8));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(base + 2, 0, 4));            // misaligned
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(base + 4 * kMiB - 1, 0, 2));  // runs past
  // The same chunk mapped twice (second half again, at base + 4 MiB) aliases one memory.
  ASSERT_CU(cuMemMap(base + 4 * kMiB, kChunk, kChunk, h, 0));
  ASSERT_CU(SetRW(base + 4 * kMiB, kChunk));
  reinterpret_cast<char*>(base)[kChunk + 5] = 'q';
  EXPECT_EQ('q', reinterpret_cast<const char*>(base)[4 * kMiB + 5]);

  // Map errors: overlap, outside or straddling the reservation, misaligned, too big, flags.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + kChunk, kChunk, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 8 * kMiB, kChunk, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 6 * kMiB, 4 * kMiB, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 6 * kMiB + 4096, kChunk, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 6 * kMiB, kChunk, 4 * kMiB, h, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 6 * kMiB, kChunk, 0, h, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(base + 6 * kMiB, kChunk, 0, h + 1000, 0));

  // Measured: part of a mapping cannot be unmapped; a reservation with mappings cannot be freed.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(base, kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(base, 8 * kMiB));  // includes a gap
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(base, 8 * kMiB));
  ASSERT_CU(cuMemUnmap(base, 4 * kMiB));
  EXPECT_EQ("---p", Perms(base));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&back, base, 1));
  EXPECT_EQ('q', reinterpret_cast<const char*>(base)[4 * kMiB + 5]);  // the other mapping lives
  ASSERT_CU(cuMemUnmap(base + 4 * kMiB, kChunk));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(base, 8 * kMiB));
}

TEST_F(SimTest, UnmapSeveralWholeMappingsAtOnce) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAddressReserve(&base, 3 * kChunk, 0, 0, 0));
  CUmemGenericAllocationHandle h[3];
  CUmemAllocationProp p = Prop();
  for (int i = 0; i < 3; ++i) {
    ASSERT_CU(cuMemCreate(&h[i], kChunk, &p, 0));
    ASSERT_CU(cuMemMap(base + i * kChunk, kChunk, 0, h[i], 0));
    ASSERT_CU(cuMemRelease(h[i]));
  }
  // One cuMemSetAccess may span several mappings.
  ASSERT_CU(SetRW(base, 3 * kChunk));
  std::memset(reinterpret_cast<void*>(base), 7, 3 * kChunk);
  EXPECT_EQ(3u, Stats().mappings - baseline_.mappings);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(base + kChunk, kChunk + 4096));
  ASSERT_CU(cuMemUnmap(base, 2 * kChunk));
  ASSERT_CU(cuMemUnmap(base + 2 * kChunk, kChunk));
  EXPECT_EQ(baseline_.live_allocations, Stats().live_allocations);  // released and unmapped
  ASSERT_CU(cuMemAddressFree(base, 3 * kChunk));
}

TEST_F(SimTest, SetAccessRules) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAddressReserve(&base, 4 * kMiB, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, kChunk, &p, 0));
  ASSERT_CU(cuMemMap(base, kChunk, 0, h, 0));
  // Measured: a range that is not fully mapped.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, SetRW(base, 4 * kMiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, SetRW(base + kChunk, kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, SetRW(base, 4096));
  EXPECT_EQ(CUDA_ERROR_INVALID_DEVICE, SetRW(base, kChunk, 3));
  CUmemAccessDesc host = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(base, kChunk, &host, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(base, kChunk, &host, 0));
  // Read-only: copies out work, copies in are refused.
  CUmemAccessDesc ro = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  ASSERT_CU(cuMemSetAccess(base, kChunk, &ro, 1));
  EXPECT_EQ("r--s", Perms(base));
  char c = 1;
  EXPECT_CU(cuMemcpyDtoH(&c, base, 1));
  EXPECT_EQ(0, c);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(base, &c, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpy(base, reinterpret_cast<CUdeviceptr>(&c), 1));
  EXPECT_CU(cuMemcpy(reinterpret_cast<CUdeviceptr>(&c), base, 1));
  // Back to no access.
  CUmemAccessDesc none = Access(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  ASSERT_CU(cuMemSetAccess(base, kChunk, &none, 1));
  EXPECT_EQ("---s", Perms(base));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&c, base, 1));
  ASSERT_CU(cuMemUnmap(base, kChunk));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(base, 4 * kMiB));
}

// ---------------------------------------------------------------------------------------------
// VMM: queries.

TEST_F(SimTest, AddressRangeIsTheMappingAttributesAreTheReservation) {
  // Measured: two 2 MiB chunks back to back in one 4 MiB reservation.
  CUdeviceptr res = 0;
  ASSERT_CU(cuMemAddressReserve(&res, 4 * kMiB, 0, 0, 0));
  CUmemGenericAllocationHandle h1 = 0, h2 = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h1, kChunk, &p, 0));
  ASSERT_CU(cuMemCreate(&h2, kChunk, &p, 0));
  ASSERT_CU(cuMemMap(res, kChunk, 0, h1, 0));
  ASSERT_CU(cuMemMap(res + kChunk, kChunk, 0, h2, 0));
  ASSERT_CU(SetRW(res, 4 * kMiB));

  CUdeviceptr b = 0;
  size_t sz = 0;
  ASSERT_CU(cuMemGetAddressRange(&b, &sz, res + kChunk + 12345));
  EXPECT_EQ(res + kChunk, b);
  EXPECT_EQ(kChunk, sz);
  ASSERT_CU(cuMemGetAddressRange(nullptr, &sz, res + 1));
  EXPECT_EQ(kChunk, sz);
  ASSERT_CU(cuMemGetAddressRange(&b, nullptr, res + 1));
  EXPECT_EQ(res, b);

  CUdeviceptr start = 0;
  size_t range = 0;
  ASSERT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, res + kChunk + 5));
  ASSERT_CU(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, res + kChunk + 5));
  EXPECT_EQ(res, start);
  EXPECT_EQ(4 * kMiB, range);
  int legacy = -1, ordinal = -1, mapped = -1, managed = -1;
  unsigned int type = 0;
  ASSERT_CU(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, res));
  EXPECT_EQ(0, legacy);  // measured: the call succeeds, the answer is 0
  ASSERT_CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, res));
  EXPECT_EQ(0, ordinal);
  ASSERT_CU(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, res));
  EXPECT_EQ(1, mapped);
  ASSERT_CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, res));
  EXPECT_EQ(0, managed);
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, res));
  EXPECT_EQ(CU_MEMORYTYPE_DEVICE, type);
  CUcontext ctx = nullptr;
  ASSERT_CU(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, res));
  EXPECT_EQ(ctx_, ctx);

  // The batch form agrees.
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, CU_POINTER_ATTRIBUTE_HOST_POINTER};
  CUdeviceptr s2 = 0;
  size_t r2 = 0;
  int l2 = -1;
  void* host = &l2;
  void* data[] = {&s2, &r2, &l2, &host};
  ASSERT_CU(cuPointerGetAttributes(4, attrs, data, res + 3 * kMiB));
  EXPECT_EQ(res, s2);
  EXPECT_EQ(4 * kMiB, r2);
  EXPECT_EQ(0, l2);
  EXPECT_EQ(nullptr, host);

  ASSERT_CU(cuMemUnmap(res + kChunk, kChunk));
  // Reserved but unmapped space is not memory the driver knows.
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&b, &sz, res + kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, res + kChunk));
  ASSERT_CU(cuMemUnmap(res, kChunk));
  ASSERT_CU(cuMemRelease(h1));
  ASSERT_CU(cuMemRelease(h2));
  ASSERT_CU(cuMemAddressFree(res, 4 * kMiB));
}

TEST_F(SimTest, UnknownPointers) {
  int local = 0;
  const auto p = reinterpret_cast<CUdeviceptr>(&local);
  CUdeviceptr b = 1;
  size_t sz = 1;
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&b, &sz, p));
  EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&b, &sz, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p));
  // cuPointerGetAttributes: not an error; values read as zero (device ordinal -2).
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  unsigned int type = 99;
  int ordinal = 99;
  CUdeviceptr start = 99;
  void* data[] = {&type, &ordinal, &start};
  ASSERT_CU(cuPointerGetAttributes(3, attrs, data, p));
  EXPECT_EQ(0u, type);
  EXPECT_EQ(-2, ordinal);
  EXPECT_EQ(0u, start);
  CUpointer_attribute unknown[] = {CU_POINTER_ATTRIBUTE_P2P_TOKENS};  // not simulated
  void* one[] = {&type};
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttributes(1, unknown, one, p));
  // Copies to or from unknown device memory fail cleanly (no fault).
  char c = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&c, p, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(0x1000, &c, 1));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(0, 0, 1));
}

TEST_F(SimTest, RetainOnInteriorAddressReturnsTheChunkHandle) {
  CUdeviceptr res = 0;
  ASSERT_CU(cuMemAddressReserve(&res, 8 * kMiB, 0, 0, 0));
  CUmemGenericAllocationHandle h1 = 0, h2 = 0, got = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h1, 4 * kMiB, &p, 0));
  ASSERT_CU(cuMemCreate(&h2, kChunk, &p, 0));
  ASSERT_CU(cuMemMap(res, 4 * kMiB, 0, h1, 0));
  ASSERT_CU(cuMemMap(res + 4 * kMiB, kChunk, 0, h2, 0));
  ASSERT_CU(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(res + 3 * kMiB + 17)));
  EXPECT_EQ(h1, got);
  ASSERT_CU(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(res + 4 * kMiB)));
  EXPECT_EQ(h2, got);
  // Measured: reserved but unmapped space, and cuMemAlloc memory, are refused.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(res + 6 * kMiB)));
  CUdeviceptr legacy = 0;
  ASSERT_CU(cuMemAlloc(&legacy, kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(legacy)));
  ASSERT_CU(cuMemFree(legacy));
  // Each retain is a reference: two releases for h1 and h2 each.
  ASSERT_CU(cuMemRelease(h1));
  ASSERT_CU(cuMemRelease(h2));
  CUmemAllocationProp props;
  ASSERT_CU(cuMemGetAllocationPropertiesFromHandle(&props, h1));  // still held once
  ASSERT_CU(cuMemRelease(h1));
  ASSERT_CU(cuMemRelease(h2));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h1));
  // Mapped chunks outlive the handles; retain hands the same value out again.
  EXPECT_EQ(2u, Stats().live_allocations - baseline_.live_allocations);
  ASSERT_CU(cuMemRetainAllocationHandle(&got, reinterpret_cast<void*>(res)));
  EXPECT_EQ(h1, got);
  ASSERT_CU(cuMemRelease(got));
  ASSERT_CU(cuMemUnmap(res, 4 * kMiB));
  ASSERT_CU(cuMemUnmap(res + 4 * kMiB, kChunk));
  ASSERT_CU(cuMemAddressFree(res, 8 * kMiB));
}

TEST_F(SimTest, ReleaseWhileMappedKeepsTheMemory) {
  Chunk c = MakeChunk(kChunk);
  std::memset(reinterpret_cast<void*>(c.ptr), 0x3C, kChunk);
  ASSERT_CU(cuMemRelease(c.handle));
  EXPECT_EQ(1u, Stats().live_allocations - baseline_.live_allocations);
  EXPECT_EQ(0x3C, reinterpret_cast<const unsigned char*>(c.ptr)[kChunk - 1]);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(c.ptr, kChunk, 0, c.handle, 0));
  int fd = -1;
  EXPECT_EQ(
      CUDA_ERROR_INVALID_VALUE,
      cuMemExportToShareableHandle(&fd, c.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_CU(cuMemUnmap(c.ptr, kChunk));
  EXPECT_EQ(baseline_.live_allocations, Stats().live_allocations);
  ASSERT_CU(cuMemAddressFree(c.ptr, kChunk));
}

// ---------------------------------------------------------------------------------------------
// VMM: export and import.

TEST_F(SimTest, ExportNeedsThePosixTypeRequestedAtCreation) {
  CUmemGenericAllocationHandle plain = 0, posix = 0;
  CUmemAllocationProp pp = Prop(0, false), px = Prop(0, true);
  ASSERT_CU(cuMemCreate(&plain, kChunk, &pp, 0));
  ASSERT_CU(cuMemCreate(&posix, kChunk, &px, 0));
  int fd = -1;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemFabricHandle fabric;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fabric, posix, CU_MEM_HANDLE_TYPE_FABRIC, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, posix, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1));
  int fd1 = -1, fd2 = -1;
  ASSERT_CU(cuMemExportToShareableHandle(&fd1, posix, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_CU(cuMemExportToShareableHandle(&fd2, posix, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_NE(fd1, fd2);  // a new fd each time, owned by the caller
  EXPECT_TRUE(fcntl(fd1, F_GETFD) & FD_CLOEXEC);
  close(fd1);
  close(fd2);
  EXPECT_EQ(baseline_.open_fds + 2, Stats().open_fds);  // the caller's fds are not the driver's
  ASSERT_CU(cuMemRelease(plain));
  ASSERT_CU(cuMemRelease(posix));
}

TEST_F(SimTest, ImportGivesANewHandleEachTimeAndDoesNotTakeTheFd) {
  Chunk c = MakeChunk(4 * kMiB);
  std::memcpy(reinterpret_cast<void*>(c.ptr + kChunk), "shared", 7);
  int fd = -1;
  ASSERT_CU(
      cuMemExportToShareableHandle(&fd, c.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  void* os = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  CUmemGenericAllocationHandle i1 = 0, i2 = 0;
  ASSERT_CU(cuMemImportFromShareableHandle(&i1, os, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ASSERT_CU(cuMemImportFromShareableHandle(&i2, os, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  EXPECT_NE(i1, i2);
  EXPECT_NE(c.handle, i1);
  EXPECT_EQ(0, fcntl(fd, F_GETFD) & ~FD_CLOEXEC);  // still open: not taken
  EXPECT_EQ(CUDA_ERROR_NOT_PERMITTED,
            cuMemImportFromShareableHandle(&i2, os, CU_MEM_HANDLE_TYPE_FABRIC));
  // Measured: an imported handle reports requestedHandleTypes = 0, yet can be re-exported.
  CUmemAllocationProp props;
  ASSERT_CU(cuMemGetAllocationPropertiesFromHandle(&props, i1));
  EXPECT_EQ(CU_MEM_HANDLE_TYPE_NONE, props.requestedHandleTypes);
  EXPECT_EQ(0, props.location.id);
  int again = -1;
  ASSERT_CU(cuMemExportToShareableHandle(&again, i1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  close(again);
  // The import maps the same memory at a second address.
  CUdeviceptr view = 0;
  ASSERT_CU(cuMemAddressReserve(&view, 4 * kMiB, 0, 0, 0));
  ASSERT_CU(cuMemMap(view, 4 * kMiB, 0, i1, 0));
  ASSERT_CU(SetRW(view, 4 * kMiB));
  EXPECT_STREQ("shared", reinterpret_cast<const char*>(view + kChunk));
  // Measured: stays mapped and readable after the import is released and the fd closed.
  ASSERT_CU(cuMemRelease(i1));
  ASSERT_CU(cuMemRelease(i2));
  close(fd);
  FreeChunk(c);
  EXPECT_STREQ("shared", reinterpret_cast<const char*>(view + kChunk));
  ASSERT_CU(cuMemUnmap(view, 4 * kMiB));
  ASSERT_CU(cuMemAddressFree(view, 4 * kMiB));
}

TEST_F(SimTest, ImportRefusesFdsThatAreNotChunks) {
  CUmemGenericAllocationHandle h = 0;
  auto import = [&h](int fd) {
    return cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  };
  int pipefd[2];
  ASSERT_EQ(0, pipe2(pipefd, O_CLOEXEC));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, import(pipefd[0]));
  close(pipefd[0]);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, import(pipefd[0]));  // closed
  close(pipefd[1]);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, import(-1));
  int memfd = memfd_create("not-a-chunk", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(0, ftruncate(memfd, kChunk));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, import(memfd));
  close(memfd);
}

TEST_F(SimTest, TwoProcessesShareAChunkThroughAnExportedFd) {
  Chunk c = MakeChunk(4 * kMiB);
  std::memset(reinterpret_cast<void*>(c.ptr), 'P', 4 * kMiB);
  int fd = -1;
  ASSERT_CU(
      cuMemExportToShareableHandle(&fd, c.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int rc = InChild([fd]() -> int {
    // The child imports from the inherited fd, maps it at its own address and writes.
    CUmemGenericAllocationHandle h = 0;
    if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS) {
      return 1;
    }
    CUdeviceptr p = 0;
    if (cuMemAddressReserve(&p, 4 * kMiB, 0, 0, 0) != CUDA_SUCCESS) return 2;
    if (cuMemMap(p, 4 * kMiB, 0, h, 0) != CUDA_SUCCESS) return 3;
    if (SetRW(p, 4 * kMiB) != CUDA_SUCCESS) return 4;
    if (reinterpret_cast<const char*>(p)[4 * kMiB - 1] != 'P') return 5;
    const char msg[] = "written by the child";
    if (cuMemcpyHtoD(p + kChunk, msg, sizeof(msg)) != CUDA_SUCCESS) return 6;
    if (cuMemUnmap(p, 4 * kMiB) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS ||
        cuMemAddressFree(p, 4 * kMiB) != CUDA_SUCCESS) {
      return 7;
    }
    return 0;
  });
  EXPECT_EQ(0, rc);
  EXPECT_STREQ("written by the child", reinterpret_cast<const char*>(c.ptr + kChunk));
  close(fd);
  FreeChunk(c);
}

// ---------------------------------------------------------------------------------------------
// Legacy memory and legacy IPC.

TEST_F(SimTest, LegacyAllocCopyQueryFree) {
  CUdeviceptr d = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&d, 0));
  ASSERT_CU(cuMemAlloc(&d, 3 * kMiB + 100));
  EXPECT_EQ(0u, d % 256);
  ASSERT_CU(cuMemsetD8(d, 0x11, 3 * kMiB + 100));
  ASSERT_CU(cuMemsetD32(d, 0xDEADBEEFu, 4));
  std::vector<unsigned char> host(3 * kMiB + 100);
  ASSERT_CU(cuMemcpyDtoH(host.data(), d, host.size()));
  EXPECT_EQ(0xEF, host[0]);
  EXPECT_EQ(0x11, host.back());
  ASSERT_CU(cuMemcpyDtoD(d + kMiB, d, 16));
  EXPECT_EQ(0xDEADBEEFu, *reinterpret_cast<const uint32_t*>(d + kMiB));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(host.data(), d + 100, host.size()));

  CUdeviceptr b = 0;
  size_t sz = 0;
  ASSERT_CU(cuMemGetAddressRange(&b, &sz, d + kMiB));
  EXPECT_EQ(d, b);
  EXPECT_EQ(3 * kMiB + 100, sz);
  int legacy = 0;
  ASSERT_CU(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d + 8));
  EXPECT_EQ(1, legacy);
  CUdeviceptr start = 0;
  ASSERT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 8));
  EXPECT_EQ(d, start);

  // cuMemFree takes only a cuMemAlloc base.
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(d + 8));
  Chunk c = MakeChunk(kChunk);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(c.ptr));
  FreeChunk(c);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(0x1000));
  ASSERT_CU(cuMemFree(d));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(d));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(host.data(), d, 1));
}

TEST_F(SimTest, IpcGetMemHandleOnlyOnLegacyMemory) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 4 * kMiB));
  CUipcMemHandle h1, h2;
  std::memset(&h1, 0xEE, sizeof(h1));
  std::memset(&h2, 0x77, sizeof(h2));
  ASSERT_CU(cuIpcGetMemHandle(&h1, d));
  ASSERT_CU(cuIpcGetMemHandle(&h2, d + kChunk + 3));  // interior: the whole allocation
  EXPECT_EQ(0, std::memcmp(&h1, &h2, sizeof(h1)));    // every byte defined
  EXPECT_EQ(0, std::memcmp(h1.reserved, "SIMLEG01", 8));
  EXPECT_NE(0, std::memcmp(h1.reserved, "VMM2", 4));
  // Measured: VMM memory, base or interior, is refused.
  Chunk c = MakeChunk(4 * kMiB);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&h2, c.ptr));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&h2, c.ptr + kChunk));
  FreeChunk(c);
  int local = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuIpcGetMemHandle(&h2, reinterpret_cast<CUdeviceptr>(&local)));
  // Measured: opening in the exporting process, or with flags 0.
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT,
            cuIpcOpenMemHandle(&p, h1, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcOpenMemHandle(&p, h1, 0));
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcCloseMemHandle(d));
  ASSERT_CU(cuMemFree(d));
}

TEST_F(SimTest, GarbageLegacyHandlesAreRefusedQuickly) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kChunk));
  CUipcMemHandle good;
  ASSERT_CU(cuIpcGetMemHandle(&good, d));
  std::mt19937_64 rng(12345);
  auto start = std::chrono::steady_clock::now();
  int refused = 0;
  int rc = InChild([&]() -> int {
    for (int i = 0; i < 2000; ++i) {
      CUipcMemHandle h;
      if (i < 1000) {
        for (auto& b : h.reserved) b = static_cast<char>(rng());
        if (i % 2 == 0) std::memcpy(h.reserved, "SIMLEG01", 8);  // right magic, rest random
      } else {
        h = good;  // one corrupted byte (or bit) of a real handle
        h.reserved[(i - 1000) % 64] ^= static_cast<char>(1 << (i % 8));
      }
      CUdeviceptr p = 0;
      if (cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) !=
          CUDA_ERROR_INVALID_VALUE) {
        return 1;
      }
      ++refused;
    }
    return refused == 2000 ? 0 : 2;
  });
  EXPECT_EQ(0, rc);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ASSERT_CU(cuMemFree(d));
}

TEST_F(SimTest, TwoProcessesShareLegacyMemoryThroughAnIpcHandle) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 3 * kMiB));
  ASSERT_CU(cuMemsetD8(d, 0x5A, 3 * kMiB));
  CUipcMemHandle handle;
  ASSERT_CU(cuIpcGetMemHandle(&handle, d));
  int rc = InChild([handle]() -> int {
    SimCudaStats before = Stats();
    CUdeviceptr p1 = 0, p2 = 0;
    if (cuIpcOpenMemHandle(&p1, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) {
      return 1;
    }
    unsigned char c = 0;
    if (cuMemcpyDtoH(&c, p1 + 3 * kMiB - 1, 1) != CUDA_SUCCESS || c != 0x5A) return 2;
    if (cuMemsetD8(p1 + kMiB, 0xC3, 4096) != CUDA_SUCCESS) return 3;
    // Measured: the same handle again gives the same pointer, reference counted.
    if (cuIpcOpenMemHandle(&p2, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS ||
        p2 != p1) {
      return 4;
    }
    if (Stats().legacy_imports != before.legacy_imports + 1) return 5;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cuMemGetAddressRange(&base, &size, p1 + 10) != CUDA_SUCCESS || base != p1 ||
        size != 3 * kMiB) {
      return 6;
    }
    if (cuIpcCloseMemHandle(p1 + kChunk) != CUDA_ERROR_INVALID_VALUE) return 7;
    if (cuIpcCloseMemHandle(p1) != CUDA_SUCCESS) return 8;
    if (reinterpret_cast<const unsigned char*>(p1)[0] != 0x5A) return 9;  // still readable
    if (cuIpcCloseMemHandle(p1) != CUDA_SUCCESS) return 10;
    if (cuIpcCloseMemHandle(p1) != CUDA_ERROR_INVALID_VALUE) return 11;  // measured
    if (Stats().legacy_imports != before.legacy_imports) return 12;
    return 0;
  });
  EXPECT_EQ(0, rc);
  std::vector<unsigned char> host(4096);
  ASSERT_CU(cuMemcpyDtoH(host.data(), d + kMiB, host.size()));
  EXPECT_EQ(std::vector<unsigned char>(4096, 0xC3), host);
  ASSERT_CU(cuMemFree(d));
}

TEST_F(SimTest, LegacyHandleOfFreedMemoryOrDeadExporterIsRefused) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kChunk));
  CUipcMemHandle stale;
  ASSERT_CU(cuIpcGetMemHandle(&stale, d));
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuMemAlloc(&d, kChunk));  // likely reuses the fd number: the inode still differs
  int rc = InChild([stale]() -> int {
    CUdeviceptr p = 0;
    return cuIpcOpenMemHandle(&p, stale, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
                   CUDA_ERROR_INVALID_VALUE
               ? 0
               : 1;
  });
  EXPECT_EQ(0, rc);
  ASSERT_CU(cuMemFree(d));

  // An exporter that has exited: its handle no longer opens.
  int pipefd[2];
  ASSERT_EQ(0, pipe2(pipefd, O_CLOEXEC));
  rc = InChild([&]() -> int {
    CUdeviceptr x = 0;
    CUipcMemHandle h;
    if (cuMemAlloc(&x, kChunk) != CUDA_SUCCESS || cuIpcGetMemHandle(&h, x) != CUDA_SUCCESS) {
      return 1;
    }
    return write(pipefd[1], &h, sizeof(h)) == sizeof(h) ? 0 : 2;
  });
  ASSERT_EQ(0, rc);
  CUipcMemHandle dead;
  ASSERT_EQ(static_cast<ssize_t>(sizeof(dead)), read(pipefd[0], &dead, sizeof(dead)));
  close(pipefd[0]);
  close(pipefd[1]);
  CUdeviceptr p = 0;
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
            cuIpcOpenMemHandle(&p, dead, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
}

// ---------------------------------------------------------------------------------------------
// Leaks, fds, faults, threads.

TEST_F(SimTest, StatsTrackACreateMapUnmapReleaseCycle) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, kChunk, &p, 0));
  SimCudaStats s = Stats();
  EXPECT_EQ(baseline_.live_allocations + 1, s.live_allocations);
  EXPECT_EQ(baseline_.open_fds + 1, s.open_fds);
  CUdeviceptr r = 0;
  ASSERT_CU(cuMemAddressReserve(&r, kChunk, 0, 0, 0));
  ASSERT_CU(cuMemMap(r, kChunk, 0, h, 0));
  s = Stats();
  EXPECT_EQ(baseline_.reservations + 1, s.reservations);
  EXPECT_EQ(baseline_.mappings + 1, s.mappings);
  ASSERT_CU(cuMemUnmap(r, kChunk));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(r, kChunk));
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kChunk));
  EXPECT_EQ(baseline_.legacy_allocations + 1, Stats().legacy_allocations);
  ASSERT_CU(cuMemFree(d));
  EXPECT_TRUE(SameStats(baseline_, Stats())) << Describe(Stats());
  EXPECT_EQ(-1, simcuda_get_stats(nullptr));
}

TEST_F(SimTest, EveryDriverFdIsCloseOnExec) {
  Chunk c = MakeChunk(kChunk);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kChunk));
  int seen = 0;
  DIR* dir = opendir("/proc/self/fd");
  ASSERT_NE(nullptr, dir);
  while (dirent* e = readdir(dir)) {
    char link[256] = {};
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), link, sizeof(link) - 1) <= 0) continue;
    if (std::strncmp(link, "/memfd:simcuda-", 15) != 0) continue;
    ++seen;
    EXPECT_TRUE(fcntl(std::atoi(e->d_name), F_GETFD) & FD_CLOEXEC) << link;
  }
  closedir(dir);
  EXPECT_GE(seen, 2);
  ASSERT_CU(cuMemFree(d));
  FreeChunk(c);
}

// The e2e tests' way to map memory past vmmipc's cuMemMap hook: the same map.
TEST_F(SimTest, MemMapHookMapsAsCuMemMapDoes) {
  CUdeviceptr base = 0;
  ASSERT_CU(cuMemAddressReserve(&base, 2 * kChunk, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, 2 * kChunk, &p, 0));
  ASSERT_EQ(CUDA_SUCCESS, simcuda_mem_map(base + kChunk, kChunk, kChunk, h));
  EXPECT_EQ(1u, Stats().mappings - baseline_.mappings);
  EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, simcuda_mem_map(base, kChunk, 2 * kChunk, h));
  ASSERT_CU(SetRW(base + kChunk, kChunk));
  reinterpret_cast<char*>(base)[kChunk + 7] = 'z';  // lands at offset kChunk + 7 of h
  ASSERT_CU(cuMemMap(base, kChunk, kChunk, h, 0));  // the same half again, through cuMemMap
  ASSERT_CU(SetRW(base, kChunk));
  EXPECT_EQ('z', reinterpret_cast<const char*>(base)[7]);
  ASSERT_CU(cuMemUnmap(base, 2 * kChunk));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(base, 2 * kChunk));
}

TEST_F(SimTest, InjectedFaultFiresOnTheNthCallOnly) {
  ASSERT_EQ(0, simcuda_inject_failure("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_EQ(-1, simcuda_inject_failure(nullptr, 1, 1));
  CUdeviceptr r = 0;
  ASSERT_CU(cuMemAddressReserve(&r, 2 * kChunk, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, kChunk, &p, 0));
  ASSERT_CU(cuMemMap(r, kChunk, 0, h, 0));
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemMap(r + kChunk, kChunk, 0, h, 0));
  EXPECT_EQ(1u, Stats().mappings - baseline_.mappings);  // the failed call changed nothing
  ASSERT_CU(cuMemMap(r + kChunk, kChunk, 0, h, 0));
  // Both spellings of a versioned call share the base name.
  ASSERT_EQ(0, simcuda_inject_failure("cuIpcOpenMemHandle", 1, CUDA_ERROR_UNKNOWN));
  CUipcMemHandle any{};
  CUdeviceptr out = 0;
  EXPECT_EQ(CUDA_ERROR_UNKNOWN, cuIpcOpenMemHandle(&out, any, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  ASSERT_EQ(0, simcuda_inject_failure("cuMemRelease", 1, CUDA_ERROR_UNKNOWN));
  ASSERT_EQ(0, simcuda_inject_failure("cuMemRelease", 0, 0));  // cancelled
  ASSERT_CU(cuMemUnmap(r, 2 * kChunk));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(r, 2 * kChunk));
}

// A delay is taken only for a call that honours it: one asked of any other
// call would never come, and a test waiting on it would be testing nothing.
TEST_F(SimTest, InjectedDelayIsRefusedForACallThatNeverWaits) {
  EXPECT_EQ(0, simcuda_inject_delay("cuMemUnmap", 1, 1));
  EXPECT_EQ(0, simcuda_inject_delay_after("cuMemExportToShareableHandle", 1, 1));
  EXPECT_EQ(-1, simcuda_inject_delay("cuMemRelease", 1, 1));
  EXPECT_EQ(-1, simcuda_inject_delay("cuMemUnmapp", 1, 1));
  EXPECT_EQ(-1, simcuda_inject_delay_after("cuMemMap", 1, 1));
  EXPECT_EQ(-1, simcuda_inject_delay(nullptr, 1, 1));
  EXPECT_EQ(-1, simcuda_inject_delay("cuMemMap", 0, 1));
  EXPECT_EQ(-1, simcuda_inject_delay("cuMemMap", 1, 60001));
  simcuda_clear_failures();  // the two taken above would fire below
  // The unmap's delay is there and the unmap still works after it.
  CUdeviceptr r = 0;
  ASSERT_CU(cuMemAddressReserve(&r, kChunk, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = Prop();
  ASSERT_CU(cuMemCreate(&h, kChunk, &p, 0));
  ASSERT_CU(cuMemMap(r, kChunk, 0, h, 0));
  ASSERT_EQ(0, simcuda_inject_delay("cuMemUnmap", 1, 200));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_CU(cuMemUnmap(r, kChunk));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(r, kChunk));
}

TEST_F(SimTest, ConcurrentThreadsDoNotCorruptTheTables) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        CUmemGenericAllocationHandle h = 0;
        CUmemAllocationProp p = Prop();
        CUdeviceptr r = 0;
        bool ok = cuMemCreate(&h, kChunk, &p, 0) == CUDA_SUCCESS &&
                  cuMemAddressReserve(&r, kChunk, 0, 0, 0) == CUDA_SUCCESS &&
                  cuMemMap(r, kChunk, 0, h, 0) == CUDA_SUCCESS && SetRW(r, kChunk) == CUDA_SUCCESS;
        if (ok) {
          reinterpret_cast<volatile int*>(r)[i] = t;
          ok = reinterpret_cast<volatile int*>(r)[i] == t;
        }
        ok = cuMemUnmap(r, kChunk) == CUDA_SUCCESS && ok;
        ok = cuMemRelease(h) == CUDA_SUCCESS && ok;
        ok = cuMemAddressFree(r, kChunk) == CUDA_SUCCESS && ok;
        if (!ok) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
}

}  // namespace
