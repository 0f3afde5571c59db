// Shared pieces of vmmipc_bench: buffer layouts, CUDA error text, timing
// samples, and the real driver's entry points reached past vmmipc's hooks
// (so that the raw-driver floor never runs through the preload).
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace vmmipc_bench {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// A buffer: chunks of these sizes mapped back to back in one reservation (VMM),
// or one cuMemAlloc of the total (legacy).
struct Layout {
  std::string name;              // benchmark name suffix: "2MiB", "1GiB", "1GiBx20MiB"
  std::vector<uint64_t> chunks;  // chunk sizes in bytes
  bool legacy_too = true;        // a legacy (cuMemAlloc) buffer of the same total exists

  uint64_t Total() const;
  std::string Describe() const;  // "51 x 20 MiB + 1 x 4 MiB = 1 GiB"
};

// The layouts, indexed by position (the exporter and the importer agree on it):
// 0 "2MiB", 1 "1GiB", 2 "1GiBx20MiB" (PyTorch's 20 MiB expandable-segment chunks:
// 51 x 20 MiB + 1 x 4 MiB, exactly 1 GiB).
const std::vector<Layout>& Layouts();

// "CUDA_ERROR_INVALID_VALUE (1): invalid argument".
std::string CuErrorText(CUresult result);
// "<what>: <CuErrorText>" when result is not CUDA_SUCCESS, else "".
std::string CuFailure(CUresult result, const std::string& what);

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> values);

// Durations of single operations, in seconds.
class Samples {
 public:
  void Add(double seconds) { values_.push_back(seconds); }
  void AddNs(int64_t ns) { values_.push_back(static_cast<double>(ns) * 1e-9); }
  bool empty() const { return values_.empty(); }
  size_t size() const { return values_.size(); }
  double MedianUs() const { return Median(values_) * 1e6; }
  double MinUs() const;

 private:
  std::vector<double> values_;
};

// The real libcuda's entry points, looked up with libc's own dlsym on the
// driver's handle: vmmipc answers dlsym (and cuGetProcAddress) on libcuda's
// handle with its hooks, so neither may be used here.
struct RealDriver {
  decltype(&::cuIpcGetMemHandle) ipc_get_mem_handle = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_get_attribute = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_shareable = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_shareable = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
};

// Resolves the table once. False (with *error) when libcuda or libc's dlsym
// cannot be found.
bool LoadRealDriver(RealDriver* out, std::string* error);
const RealDriver& Real();  // after a successful LoadRealDriver in main

// Driver names whose global definition is not libcuda's own (hooked by a
// preloaded library), out of the names this program uses.
std::vector<std::string> HookedDriverNames(std::string* error);

// Memory this process allocated: one cuMemAlloc (legacy), or chunks created
// with POSIX-fd export, mapped back to back in one reservation, read-write for
// the device (VMM). Created through the linked entry points, as a program does.
struct OwnedBuffer {
  bool vmm = false;
  CUdeviceptr base = 0;
  uint64_t total = 0;
  uint64_t reserved = 0;
  std::vector<CUmemGenericAllocationHandle> handles;  // VMM: one per chunk
  std::vector<uint64_t> sizes;                        // VMM: chunk sizes
};
bool AllocBuffer(const Layout& layout, bool vmm, CUdevice device, OwnedBuffer* out,
                 std::string* error);
void FreeBuffer(OwnedBuffer* buffer);

// Threads of this process (/proc/self/status), or -1.
int CountThreads();

}  // namespace vmmipc_bench
