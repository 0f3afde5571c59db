// vmmipc_peer: a scriptable CUDA driver client for the end-to-end tests. The
// tests start it (with libvmmipc.so preloaded) as exporter or importer and
// drive it one command per line on stdin; it answers one line on stdout:
// "ok [values]" or "err <CUresult> <name>". It is linked against libcuda
// (the simulated one in CI, the real one on a GPU machine), and resolves the
// IPC entry points through the path a test asks for, like real clients do:
//   direct    the linked symbols (cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, ...)
//   dlsym     dlsym(dlopen("libcuda.so.1"), "...")
//   procN     cuGetProcAddress_v2("cuIpcOpenMemHandle", N) for N = 4010, 11000, 12000
//   self      cuGetProcAddress itself obtained through cuGetProcAddress (libcudart's way)
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sim_introspect.h"
#include "state/handle_codec.h"

namespace {

using GetHandleFn = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
using OpenFn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
using CloseFn = CUresult (*)(CUdeviceptr);
using ProcV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct IpcFns {
  GetHandleFn get = nullptr;
  OpenFn open = nullptr;
  CloseFn close = nullptr;
};

struct VmmBuffer {
  CUdeviceptr base = 0;
  size_t reserved = 0;
  size_t chunk = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

std::map<std::string, VmmBuffer> g_vmm;
CUcontext g_context = nullptr;
CUdevice g_device = 0;

std::string Err(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return "err " + std::to_string(static_cast<int>(r)) + " " + (name ? name : "?");
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t Num(const std::string& s) { return std::stoull(s, nullptr, 0); }

std::string HandleToHex(const CUipcMemHandle& h) {
  std::string out;
  char buf[3];
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(h.reserved[i]));
    out += buf;
  }
  return out;
}

bool HexToHandle(const std::string& hex, CUipcMemHandle* h) {
  if (hex.size() != 2 * CU_IPC_HANDLE_SIZE) return false;
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i)
    h->reserved[i] = static_cast<char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return true;
}

// Resolves the three IPC functions through one of the client paths.
std::string Resolve(const std::string& path, IpcFns* fns) {
  if (path == "direct") {
    *fns = {&cuIpcGetMemHandle, &cuIpcOpenMemHandle, &cuIpcCloseMemHandle};
    return "ok";
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return "err dlopen";
  if (path == "dlsym") {
    fns->get = reinterpret_cast<GetHandleFn>(dlsym(lib, "cuIpcGetMemHandle"));
    fns->open = reinterpret_cast<OpenFn>(dlsym(lib, "cuIpcOpenMemHandle_v2"));
    fns->close = reinterpret_cast<CloseFn>(dlsym(lib, "cuIpcCloseMemHandle"));
    return fns->get && fns->open && fns->close ? "ok" : "err dlsym";
  }
  auto proc = reinterpret_cast<ProcV2Fn>(dlsym(lib, "cuGetProcAddress_v2"));
  if (proc == nullptr) return "err no cuGetProcAddress_v2";
  int version = 12000;
  if (path == "self") {
    void* self = nullptr;
    CUdriverProcAddressQueryResult status;
    CUresult r = proc("cuGetProcAddress", &self, 12000, 0, &status);
    if (r != CUDA_SUCCESS) return Err(r);
    proc = reinterpret_cast<ProcV2Fn>(self);
  } else if (path.rfind("proc", 0) == 0) {
    version = std::stoi(path.substr(4));
  } else {
    return "err unknown path";
  }
  CUdriverProcAddressQueryResult status;
  void* p = nullptr;
  CUresult r = proc("cuIpcGetMemHandle", &p, version, 0, &status);
  if (r != CUDA_SUCCESS) return Err(r);
  fns->get = reinterpret_cast<GetHandleFn>(p);
  r = proc("cuIpcOpenMemHandle", &p, version, 0, &status);
  if (r != CUDA_SUCCESS) return Err(r);
  fns->open = reinterpret_cast<OpenFn>(p);
  r = proc("cuIpcCloseMemHandle", &p, version, 0, &status);
  if (r != CUDA_SUCCESS) return Err(r);
  fns->close = reinterpret_cast<CloseFn>(p);
  return "ok";
}

// Deterministic contents: byte i of a region seeded s.
unsigned char Pattern(uint64_t seed, uint64_t i) {
  return static_cast<unsigned char>((seed * 131 + i * 7 + (i >> 12)) & 0xFF);
}

std::string Fill(uint64_t addr, uint64_t size, uint64_t seed) {
  std::vector<unsigned char> host(size);
  for (uint64_t i = 0; i < size; ++i) host[i] = Pattern(seed, i);
  CUresult r = cuMemcpyHtoD(addr, host.data(), size);
  return r == CUDA_SUCCESS ? "ok" : Err(r);
}

// Checks [addr, addr + size) against the pattern of `seed` starting at `offset`.
std::string Check(uint64_t addr, uint64_t size, uint64_t seed, uint64_t offset) {
  std::vector<unsigned char> host(size);
  CUresult r = cuMemcpyDtoH(host.data(), addr, size);
  if (r != CUDA_SUCCESS) return Err(r);
  for (uint64_t i = 0; i < size; ++i)
    if (host[i] != Pattern(seed, offset + i)) return "mismatch at " + std::to_string(i);
  return "ok";
}

std::string AllocVmm(const std::string& name, uint64_t chunk, uint64_t count, uint64_t extra,
                     bool posix) {
  VmmBuffer buf;
  buf.chunk = chunk;
  buf.reserved = chunk * count + extra;
  CUresult r = cuMemAddressReserve(&buf.base, buf.reserved, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_device;
  if (posix) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  for (uint64_t i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle h = 0;
    if ((r = cuMemCreate(&h, chunk, &prop, 0)) != CUDA_SUCCESS) return Err(r);
    if ((r = cuMemMap(buf.base + i * chunk, chunk, 0, h, 0)) != CUDA_SUCCESS) return Err(r);
    buf.handles.push_back(h);
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = g_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = cuMemSetAccess(buf.base, chunk * count, &access, 1)) != CUDA_SUCCESS) return Err(r);
  g_vmm[name] = buf;
  return "ok " + Hex(buf.base);
}

std::string FreeVmm(const std::string& name) {
  auto it = g_vmm.find(name);
  if (it == g_vmm.end()) return "err no such buffer";
  VmmBuffer& buf = it->second;
  for (size_t i = 0; i < buf.handles.size(); ++i) {
    CUresult r = cuMemUnmap(buf.base + i * buf.chunk, buf.chunk);
    if (r != CUDA_SUCCESS) return Err(r);
    if ((r = cuMemRelease(buf.handles[i])) != CUDA_SUCCESS) return Err(r);
  }
  CUresult r = cuMemAddressFree(buf.base, buf.reserved);
  g_vmm.erase(it);
  return r == CUDA_SUCCESS ? "ok" : Err(r);
}

int CountFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 3;  // ".", ".." and the DIR's own fd
}

std::string Stats() {
  using StatsFn = int (*)(SimCudaStats*);
  auto fn = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "simcuda_get_stats"));
  if (fn == nullptr) return "err not the simulated driver";
  SimCudaStats s = {};
  fn(&s);
  std::ostringstream out;
  out << "ok mappings=" << s.mappings << " reservations=" << s.reservations
      << " allocations=" << s.live_allocations << " legacy_imports=" << s.legacy_imports
      << " fds=" << CountFds();
  return out.str();
}

std::string Attr(uint64_t addr, const std::string& which) {
  if (which == "ipc_capable") {
    int v = -1;
    CUresult r = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, addr);
    return r == CUDA_SUCCESS ? "ok " + std::to_string(v) : Err(r);
  }
  CUdeviceptr start = 0;
  size_t size = 0;
  CUresult r = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr);
  if (r == CUDA_SUCCESS) r = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr);
  return r == CUDA_SUCCESS ? "ok " + Hex(start) + " " + Hex(size) : Err(r);
}

std::string Run(const std::vector<std::string>& a, IpcFns* fns) {
  const std::string& cmd = a[0];
  if (cmd == "init") {
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGet(&g_device, a.size() > 1 ? std::stoi(a[1]) : 0);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&g_context, g_device);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(g_context);
    return r == CUDA_SUCCESS ? "ok" : Err(r);
  }
  if (cmd == "resolve") return Resolve(a.at(1), fns);
  if (cmd == "pid") return "ok " + std::to_string(getpid());
  if (cmd == "alloc_vmm")  // name chunk count [extra] [noposix]
    return AllocVmm(a.at(1), Num(a.at(2)), Num(a.at(3)), a.size() > 4 ? Num(a[4]) : 0,
                    !(a.size() > 5 && a[5] == "noposix"));
  if (cmd == "free_vmm") return FreeVmm(a.at(1));
  if (cmd == "alloc_legacy") {
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, Num(a.at(1)));
    return r == CUDA_SUCCESS ? "ok " + Hex(p) : Err(r);
  }
  if (cmd == "free_legacy") {
    CUresult r = cuMemFree(Num(a.at(1)));
    return r == CUDA_SUCCESS ? "ok" : Err(r);
  }
  if (cmd == "fill") return Fill(Num(a.at(1)), Num(a.at(2)), Num(a.at(3)));
  if (cmd == "check")  // addr size seed [offset]
    return Check(Num(a.at(1)), Num(a.at(2)), Num(a.at(3)), a.size() > 4 ? Num(a[4]) : 0);
  if (cmd == "get") {
    CUipcMemHandle h = {};
    CUresult r = fns->get(&h, Num(a.at(1)));
    return r == CUDA_SUCCESS ? "ok " + HandleToHex(h) : Err(r);
  }
  if (cmd == "open") {  // hex [flags]
    CUipcMemHandle h = {};
    if (!HexToHandle(a.at(1), &h)) return "err bad hex";
    CUdeviceptr p = 0;
    unsigned flags = a.size() > 2 ? static_cast<unsigned>(Num(a[2]))
                                  : static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    CUresult r = fns->open(&p, h, flags);
    return r == CUDA_SUCCESS ? "ok " + Hex(p) : Err(r);
  }
  if (cmd == "close") {
    CUresult r = fns->close(Num(a.at(1)));
    return r == CUDA_SUCCESS ? "ok" : Err(r);
  }
  if (cmd == "attr") return Attr(Num(a.at(1)), a.at(2));
  if (cmd == "range") {
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = cuMemGetAddressRange(&base, &size, Num(a.at(1)));
    return r == CUDA_SUCCESS ? "ok " + Hex(base) + " " + Hex(size) : Err(r);
  }
  if (cmd == "occupy") {  // addr size: take address space so the zone cannot go there
    void* want = reinterpret_cast<void*>(Num(a.at(1)));
    void* got = mmap(want, Num(a.at(2)), PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    return got == want ? "ok" : "err mmap";
  }
  if (cmd == "reserve") {  // size [alignment]: a bare cuMemAddressReserve
    CUdeviceptr p = 0;
    CUresult r = cuMemAddressReserve(&p, Num(a.at(1)), a.size() > 2 ? Num(a[2]) : 0, 0, 0);
    return r == CUDA_SUCCESS ? "ok " + Hex(p) : Err(r);
  }
  if (cmd == "address_free") {  // ptr size
    CUresult r = cuMemAddressFree(Num(a.at(1)), Num(a.at(2)));
    return r == CUDA_SUCCESS ? "ok" : Err(r);
  }
  if (cmd == "stats") return Stats();
  if (cmd == "decode") {  // hex: the VMM2 fields, for the demo
    CUipcMemHandle raw = {};
    if (!HexToHandle(a.at(1), &raw)) return "err bad hex";
    vmmipc::state::Vmm2Handle h;
    auto status =
        vmmipc::state::DecodeHandle(reinterpret_cast<const unsigned char*>(raw.reserved), &h);
    if (status != vmmipc::state::DecodeStatus::kOk)
      return std::string("err ") + vmmipc::state::DecodeStatusName(status);
    std::ostringstream out;
    out << "ok version=" << int(h.version) << " rank_slot="
        << (h.rank_slot == vmmipc::state::kUnranked ? std::string("unranked")
                                                     : std::to_string(h.rank_slot))
        << " pid=" << h.pid << " generation=" << h.generation << " address=" << Hex(h.address)
        << " chunk=" << Hex(h.chunk_base) << "+" << Hex(h.chunk_size)
        << " region_base=" << Hex(h.region_base);
    return out.str();
  }
  if (cmd == "fds") return "ok " + std::to_string(CountFds());
  if (cmd == "rtld_next") {  // dlsym(RTLD_NEXT) from this program must see the preload first
    void* next = dlsym(RTLD_NEXT, "cuIpcGetMemHandle");
    void* dflt = dlsym(RTLD_DEFAULT, "cuIpcGetMemHandle");
    return next == dflt ? "ok" : "err next=" + Hex(reinterpret_cast<uint64_t>(next)) +
                                     " default=" + Hex(reinterpret_cast<uint64_t>(dflt));
  }
  return "err unknown command " + cmd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "probe") {
    // Exit 0 with a device, 77 without: the tests' skip signal.
    int count = 0;
    return cuInit(0) == CUDA_SUCCESS && cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0
               ? 0
               : 77;
  }
  IpcFns fns = {&cuIpcGetMemHandle, &cuIpcOpenMemHandle, &cuIpcCloseMemHandle};
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::vector<std::string> args;
    for (std::string word; in >> word;) args.push_back(word);
    if (args.empty()) continue;
    if (args[0] == "exit") break;
    std::string reply;
    try {
      reply = Run(args, &fns);
    } catch (const std::exception& e) {
      reply = std::string("err exception ") + e.what();
    }
    std::cout << reply << std::endl;
  }
  return 0;
}
