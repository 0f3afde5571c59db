// vmm_cuda_malloc: an LD_PRELOAD test double that makes a libcudart program's
// cudaMalloc hand out VMM memory, as PyTorch's expandable segments or a
// memory saver do: each cudaMalloc reserves its range and maps cuMemCreate
// chunks of VMM_CUDA_MALLOC_CHUNK bytes (default 20 MiB, PyTorch's segment
// chunk; 0: one chunk for the whole buffer) back to back; cudaFree unmaps
// and releases them. Pointers it did not make go to the real cudaFree. For
// UCX's ucx_perftest (tests/python/ucx_perftest_check.py), whose CUDA buffers
// come from cudaMalloc. The driver is reached through dlopen("libcuda.so.1")
// + dlsym, so that a preloaded vmmipc sees these calls as any program's.
// Not part of libvmmipc.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace {

using CudaError = int;  // cudaError_t, without cudart's headers
constexpr CudaError kCudaSuccess = 0;
constexpr CudaError kCudaErrorMemoryAllocation = 2;

struct Driver {
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  bool ok = false;
};

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == nullptr) return d;
    auto load = [&](auto* slot, const char* name) {
      *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(dlsym(cuda, name));
      return *slot != nullptr;
    };
    d.ok = load(&d.ctx_get_device, "cuCtxGetDevice") &&
           load(&d.granularity, "cuMemGetAllocationGranularity") &&
           load(&d.reserve, "cuMemAddressReserve") && load(&d.address_free, "cuMemAddressFree") &&
           load(&d.create, "cuMemCreate") && load(&d.map, "cuMemMap") &&
           load(&d.unmap, "cuMemUnmap") && load(&d.release, "cuMemRelease") &&
           load(&d.set_access, "cuMemSetAccess");
    return d;
  }();
  return driver;
}

struct Buffer {
  uint64_t size = 0;                                                      // reserved and mapped
  std::vector<std::pair<CUmemGenericAllocationHandle, uint64_t>> chunks;  // handle, size
};

std::mutex g_mutex;
std::map<CUdeviceptr, Buffer>& Buffers() {
  static auto* buffers = new std::map<CUdeviceptr, Buffer>;
  return *buffers;
}

uint64_t ChunkBytes() {
  const char* text = std::getenv("VMM_CUDA_MALLOC_CHUNK");
  return text == nullptr ? (20ull << 20) : std::strtoull(text, nullptr, 0);
}

void Undo(const Driver& d, CUdeviceptr base, Buffer* b) {
  uint64_t offset = 0;
  for (auto& [handle, size] : b->chunks) {
    d.unmap(base + offset, size);
    d.release(handle);
    offset += size;
  }
  d.address_free(base, b->size);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) CudaError cudaMalloc(void** pointer,
                                                                       size_t size) {
  const Driver& d = GetDriver();
  CUdevice device = 0;
  if (pointer == nullptr || !d.ok || d.ctx_get_device(&device) != CUDA_SUCCESS)
    return kCudaErrorMemoryAllocation;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
    return kCudaErrorMemoryAllocation;
  const uint64_t total =
      (std::max<uint64_t>(size, 1) + granularity - 1) / granularity * granularity;
  uint64_t chunk = ChunkBytes() == 0 ? total : ChunkBytes();
  chunk = (chunk + granularity - 1) / granularity * granularity;
  CUdeviceptr base = 0;
  if (d.reserve(&base, total, granularity, 0, 0) != CUDA_SUCCESS) return kCudaErrorMemoryAllocation;
  Buffer b;
  b.size = total;
  CUresult r = CUDA_SUCCESS;
  for (uint64_t offset = 0; offset < total && r == CUDA_SUCCESS;) {
    const uint64_t bytes = std::min(chunk, total - offset);
    CUmemGenericAllocationHandle handle = 0;
    r = d.create(&handle, bytes, &prop, 0);
    if (r != CUDA_SUCCESS) break;
    r = d.map(base + offset, bytes, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      d.release(handle);
      break;
    }
    b.chunks.emplace_back(handle, bytes);
    offset += bytes;
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(base, total, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "vmm_cuda_malloc: %zu bytes: CUresult %d\n", size, static_cast<int>(r));
    Undo(d, base, &b);
    return kCudaErrorMemoryAllocation;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  Buffers()[base] = std::move(b);
  *pointer = reinterpret_cast<void*>(base);
  return kCudaSuccess;
}

extern "C" __attribute__((visibility("default"))) CudaError cudaFree(void* pointer) {
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(pointer);
  Buffer b;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = Buffers().find(base);
    if (it != Buffers().end()) {
      b = std::move(it->second);
      Buffers().erase(it);
    }
  }
  if (b.size != 0) {
    Undo(GetDriver(), base, &b);
    return kCudaSuccess;
  }
  using Free = CudaError (*)(void*);
  static const Free real_free = reinterpret_cast<Free>(dlsym(RTLD_NEXT, "cudaFree"));
  return real_free != nullptr ? real_free(pointer) : kCudaSuccess;
}
