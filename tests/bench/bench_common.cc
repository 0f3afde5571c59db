// Layouts, error text, samples and the real-driver table of vmmipc_bench.
//
// The real driver is reached with libc's own dlsym: the reference below binds
// at link time to dlvsym@<glibc base version>, which only libc defines (vmmipc
// exports dlvsym at GLIBC_2.34 only), the same way csrc/driver/real_symbols.cc
// does; libc's dlvsym then hands out libc's dlsym.
#include "bench_common.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <type_traits>

#if defined(__x86_64__)
#define VMMIPC_BENCH_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define VMMIPC_BENCH_GLIBC_BASE "GLIBC_2.17"
#else
#error "vmmipc_bench supports x86-64 and aarch64 Linux"
#endif

extern "C" void* vmmipc_bench_libc_dlvsym(void* handle, const char* name, const char* version);
__asm__(".symver vmmipc_bench_libc_dlvsym, dlvsym@" VMMIPC_BENCH_GLIBC_BASE);

namespace vmmipc_bench {
namespace {

using DlsymFn = void* (*)(void*, const char*);

RealDriver g_real;

std::string SizeText(uint64_t bytes) {
  if (bytes % kGiB == 0) return std::to_string(bytes / kGiB) + " GiB";
  return std::to_string(bytes / kMiB) + " MiB";
}

DlsymFn LibcDlsym(std::string* error) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc != nullptr) {
    for (const char* version : {"GLIBC_2.34", VMMIPC_BENCH_GLIBC_BASE}) {
      if (void* fn = vmmipc_bench_libc_dlvsym(libc, "dlsym", version))
        return reinterpret_cast<DlsymFn>(fn);
    }
  }
  // glibc < 2.34 keeps dlsym in libdl.
  void* libdl = dlopen("libdl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (libdl != nullptr) {
    if (void* fn = vmmipc_bench_libc_dlvsym(libdl, "dlsym", VMMIPC_BENCH_GLIBC_BASE))
      return reinterpret_cast<DlsymFn>(fn);
  }
  *error = "cannot find libc's own dlsym (dlvsym of libc.so.6 / libdl.so.2 failed)";
  return nullptr;
}

void* DriverHandle(std::string* error) {
  // Linked, so already loaded: NOLOAD finds it by soname (the simulator has the same soname).
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) *error = std::string("libcuda.so.1 is not loaded: ") + dlerror();
  return handle;
}

const char* const kUsedNames[] = {"cuIpcGetMemHandle",
                                  "cuIpcOpenMemHandle_v2",
                                  "cuIpcCloseMemHandle",
                                  "cuPointerGetAttribute",
                                  "cuMemCreate",
                                  "cuMemRelease",
                                  "cuMemAddressReserve",
                                  "cuMemAddressFree",
                                  "cuMemMap",
                                  "cuMemUnmap",
                                  "cuMemSetAccess",
                                  "cuMemExportToShareableHandle",
                                  "cuMemImportFromShareableHandle",
                                  "cuMemcpyDtoD_v2",
                                  "cuMemAlloc_v2",
                                  "cuInit"};

}  // namespace

uint64_t Layout::Total() const {
  uint64_t total = 0;
  for (uint64_t c : chunks) total += c;
  return total;
}

std::string Layout::Describe() const {
  // Runs of equal sizes: "51 x 20 MiB + 1 x 4 MiB = 1 GiB".
  std::string out;
  for (size_t i = 0; i < chunks.size();) {
    size_t j = i;
    while (j < chunks.size() && chunks[j] == chunks[i]) ++j;
    if (!out.empty()) out += " + ";
    out += std::to_string(j - i) + " x " + SizeText(chunks[i]);
    i = j;
  }
  return out + " = " + SizeText(Total());
}

const std::vector<Layout>& Layouts() {
  static const std::vector<Layout> layouts = [] {
    std::vector<Layout> l;
    l.push_back({"2MiB", {2 * kMiB}, true});
    l.push_back({"1GiB", {kGiB}, true});
    Layout torch{"1GiBx20MiB", {}, false};
    for (int i = 0; i < 51; ++i) torch.chunks.push_back(20 * kMiB);
    torch.chunks.push_back(4 * kMiB);  // 51 x 20 MiB = 1020 MiB; 4 MiB more makes 1 GiB
    l.push_back(torch);
    return l;
  }();
  return layouts;
}

std::string CuErrorText(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out = name != nullptr ? name : "CUDA error";
  out += " (" + std::to_string(static_cast<int>(result)) + ")";
  if (text != nullptr) out += std::string(": ") + text;
  return out;
}

std::string CuFailure(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return "";
  return what + ": " + CuErrorText(result);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

double Samples::MinUs() const {
  if (values_.empty()) return 0.0;
  return *std::min_element(values_.begin(), values_.end()) * 1e6;
}

bool LoadRealDriver(RealDriver* out, std::string* error) {
  DlsymFn real_dlsym = LibcDlsym(error);
  if (real_dlsym == nullptr) return false;
  void* cuda = DriverHandle(error);
  if (cuda == nullptr) return false;
  RealDriver d;
  bool ok = true;
  auto load = [&](auto* slot, const char* name) {
    void* fn = real_dlsym(cuda, name);
    if (fn == nullptr) {
      ok = false;
      *error += std::string(error->empty() ? "" : "; ") + "libcuda.so.1 has no " + name;
    }
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(fn);
  };
  load(&d.ipc_get_mem_handle, "cuIpcGetMemHandle");
  load(&d.pointer_get_attribute, "cuPointerGetAttribute");
  load(&d.export_shareable, "cuMemExportToShareableHandle");
  load(&d.import_shareable, "cuMemImportFromShareableHandle");
  load(&d.address_reserve, "cuMemAddressReserve");
  load(&d.address_free, "cuMemAddressFree");
  load(&d.map, "cuMemMap");
  load(&d.unmap, "cuMemUnmap");
  load(&d.set_access, "cuMemSetAccess");
  load(&d.release, "cuMemRelease");
  if (!ok) return false;
  *out = d;
  g_real = d;
  return true;
}

const RealDriver& Real() { return g_real; }

std::vector<std::string> HookedDriverNames(std::string* error) {
  std::vector<std::string> hooked;
  DlsymFn real_dlsym = LibcDlsym(error);
  void* cuda = real_dlsym != nullptr ? DriverHandle(error) : nullptr;
  if (cuda == nullptr) return hooked;
  for (const char* name : kUsedNames) {
    void* global = real_dlsym(RTLD_DEFAULT, name);
    void* own = real_dlsym(cuda, name);
    if (global != nullptr && own != nullptr && global != own) hooked.push_back(name);
  }
  return hooked;
}

bool AllocBuffer(const Layout& layout, bool vmm, CUdevice device, OwnedBuffer* out,
                 std::string* error) {
  OwnedBuffer b;
  b.vmm = vmm;
  b.total = layout.Total();
  CUresult r;
  if (!vmm) {
    r = cuMemAlloc(&b.base, b.total);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemAlloc(" + std::to_string(b.total) + " bytes)");
      return false;
    }
    *out = b;
    return true;
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  r = cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) {
    *error = CuFailure(r, "cuMemGetAllocationGranularity");
    return false;
  }
  for (uint64_t size : layout.chunks) {
    if (granularity == 0 || size % granularity != 0) {
      *error = "chunk size " + std::to_string(size) + " of layout " + layout.name +
               " is not a multiple of the allocation granularity " + std::to_string(granularity);
      return false;
    }
  }
  b.reserved = b.total;
  r = cuMemAddressReserve(&b.base, b.reserved, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    *error = CuFailure(r, "cuMemAddressReserve(" + std::to_string(b.reserved) + ")");
    return false;
  }
  uint64_t offset = 0;
  for (uint64_t size : layout.chunks) {
    CUmemGenericAllocationHandle h = 0;
    r = cuMemCreate(&h, size, &prop, 0);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemCreate(" + std::to_string(size) + ", POSIX fd)");
      FreeBuffer(&b);
      return false;
    }
    r = cuMemMap(b.base + offset, size, 0, h, 0);
    if (r != CUDA_SUCCESS) {
      *error = CuFailure(r, "cuMemMap");
      cuMemRelease(h);
      FreeBuffer(&b);
      return false;
    }
    b.handles.push_back(h);
    b.sizes.push_back(size);
    offset += size;
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = cuMemSetAccess(b.base, b.total, &access, 1);
  if (r != CUDA_SUCCESS) {
    *error = CuFailure(r, "cuMemSetAccess");
    FreeBuffer(&b);
    return false;
  }
  *out = b;
  return true;
}

void FreeBuffer(OwnedBuffer* b) {
  if (b->base == 0) return;
  if (!b->vmm) {
    cuMemFree(b->base);
  } else {
    uint64_t offset = 0;
    for (size_t i = 0; i < b->handles.size(); ++i) {
      cuMemUnmap(b->base + offset, b->sizes[i]);
      cuMemRelease(b->handles[i]);
      offset += b->sizes[i];
    }
    cuMemAddressFree(b->base, b->reserved);
  }
  *b = OwnedBuffer{};
}

int CountThreads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

}  // namespace vmmipc_bench
