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
// The fault tests (fault_test.cc) add commands that inject simulated-driver
// failures, map a chunk at a non-zero offset of its allocation, cap
// RLIMIT_NOFILE, open and export from many threads, fork, and audit CLOEXEC
// (FaultCommand).
// The follow tests (follow_test.cc) pause and resume a VMM buffer the way
// torch_memory_saver does (pause, resume), and replay a graph captured before
// (graph_capture, graph_launch; real driver only); the follow-holder tests
// (follow_holders_test.cc) watch an exporter without the library, to see
// every event it sends (raw_watch, raw_events, raw_ack, raw_watches: raw_follower.h).
// fork_memfds counts the memfds a forked child keeps.
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ledger/handle_codec.h"
#include "raw_follower.h"
#include "sim_introspect.h"

namespace {

using GetHandleFn = CUresult (*)(CUipcMemHandle*, CUdeviceptr);
using OpenFn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
using CloseFn = CUresult (*)(CUdeviceptr);
using ProcV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                              CUdriverProcAddressQueryResult*);

struct IpcFns {
  GetHandleFn get = nullptr;
  OpenFn open = nullptr;
  CloseFn close = nullptr;
};

struct VmmBuffer {
  CUdeviceptr base = 0;
  size_t reserved = 0;
  size_t chunk = 0;
  bool posix = true;
  std::vector<CUmemGenericAllocationHandle> handles;  // none while paused
  size_t paused_chunks = 0;                           // how many `pause` unmapped and released
};

std::map<std::string, VmmBuffer> g_vmm;
CUcontext g_context = nullptr;
// open_bg: one open on a thread of its own, so that the test can do other
// calls in this process while it waits on its exporter.
// Background opens by name ("" when none is given): open_bg, open_bg_result.
std::map<std::string, std::thread> g_background_open;
std::map<std::string, std::string> g_background_result;  // under g_background_mutex
std::mutex g_background_mutex;
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

// cuMemCreate + cuMemMap of `count` chunks of `chunk` bytes from buf->base,
// then cuMemSetAccess over them: how alloc_vmm maps, and resume maps again.
CUresult MapChunks(VmmBuffer* buf, uint64_t chunk, uint64_t count) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_device;
  if (buf->posix) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUresult r = CUDA_SUCCESS;
  for (uint64_t i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle h = 0;
    if ((r = cuMemCreate(&h, chunk, &prop, 0)) != CUDA_SUCCESS) return r;
    if ((r = cuMemMap(buf->base + i * chunk, chunk, 0, h, 0)) != CUDA_SUCCESS) return r;
    buf->handles.push_back(h);
  }
  buf->chunk = chunk;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = g_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(buf->base, chunk * count, &access, 1);
}

// cuMemUnmap and cuMemRelease of every chunk, the reservation kept.
CUresult UnmapChunks(VmmBuffer* buf) {
  for (size_t i = 0; i < buf->handles.size(); ++i) {
    CUresult r = cuMemUnmap(buf->base + i * buf->chunk, buf->chunk);
    if (r != CUDA_SUCCESS) return r;
    if ((r = cuMemRelease(buf->handles[i])) != CUDA_SUCCESS) return r;
  }
  buf->handles.clear();
  return CUDA_SUCCESS;
}

std::string AllocVmm(const std::string& name, uint64_t chunk, uint64_t count, uint64_t extra,
                     bool posix) {
  VmmBuffer buf;
  buf.reserved = chunk * count + extra;
  buf.posix = posix;
  CUresult r = cuMemAddressReserve(&buf.base, buf.reserved, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  if ((r = MapChunks(&buf, chunk, count)) != CUDA_SUCCESS) return Err(r);
  g_vmm[name] = buf;
  return "ok " + Hex(buf.base);
}

std::string FreeVmm(const std::string& name) {
  auto it = g_vmm.find(name);
  if (it == g_vmm.end()) return "err no such buffer";
  VmmBuffer& buf = it->second;
  CUresult r = UnmapChunks(&buf);
  if (r != CUDA_SUCCESS) return Err(r);
  r = cuMemAddressFree(buf.base, buf.reserved);
  g_vmm.erase(it);
  return r == CUDA_SUCCESS ? "ok" : Err(r);
}

// torch_memory_saver's pause (vLLM's sleep): every chunk unmapped and released,
// the VA reservation kept for the resume.
std::string PauseVmm(const std::string& name) {
  auto it = g_vmm.find(name);
  if (it == g_vmm.end()) return "err no such buffer";
  VmmBuffer& buf = it->second;
  if (buf.handles.empty()) return "err already paused";
  const size_t chunks = buf.handles.size();
  CUresult r = UnmapChunks(&buf);
  if (r != CUDA_SUCCESS) return Err(r);
  buf.paused_chunks = chunks;
  return "ok";
}

// Its resume: new memory created and mapped at the same chunk addresses. With
// a chunk size other than the paused one, one chunk of that size at the base
// (a resume the importers must refuse).
std::string ResumeVmm(const std::string& name, uint64_t chunk) {
  auto it = g_vmm.find(name);
  if (it == g_vmm.end()) return "err no such buffer";
  VmmBuffer& buf = it->second;
  if (buf.paused_chunks == 0) return "err not paused";
  if (chunk == 0) chunk = buf.chunk;
  const uint64_t count = chunk == buf.chunk ? buf.paused_chunks : 1;
  if (chunk * count > buf.reserved) return "err larger than the reservation";
  CUresult r = MapChunks(&buf, chunk, count);
  if (r != CUDA_SUCCESS) return Err(r);
  buf.paused_chunks = 0;
  return "ok";
}

// The fd numbers listed in `dir` (a /proc fd directory), but the listing's
// own and `also_ours`.
std::set<std::string> FdNames(const std::string& dir, int also_ours = -1) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.insert(e->d_name);
    }
    names.erase(std::to_string(dirfd(d)));
    closedir(d);
  }
  names.erase(std::to_string(also_ours));
  return names;
}

// The library's fd reaper keeps its inbox from its first use on, which is
// not a leak: one fd, two where its threads share this process's fd table.
// Its threads are named vmmipc-reaper; a private table lists other fds.
int ReaperInboxFds(const std::set<std::string>& own) {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return 0;
  int inbox_fds = 0;
  while (dirent* task = readdir(tasks)) {
    if (task->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + task->d_name;
    std::string name;
    {
      std::ifstream comm(dir + "/comm");  // closed before the listing below
      std::getline(comm, name);
    }
    if (name != "vmmipc-reaper") continue;
    inbox_fds = FdNames(dir + "/fd", dirfd(tasks)) == own ? 2 : 1;
    break;
  }
  closedir(tasks);
  return inbox_fds;
}

int CountFds() {
  const std::set<std::string> names = FdNames("/proc/self/fd");
  return static_cast<int>(names.size()) - ReaperInboxFds(names);
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

// --- fault, concurrency and fork commands (tests/e2e/fault_test.cc) -------------------------

std::string Run(const std::vector<std::string>& a, IpcFns* fns);

// Set in the children this peer forks. LeakSanitizer, at their exit, cannot
// suspend or properly scan the threads that stayed in the parent (the
// listener's), so what only their stacks referenced at the fork reads as leaked.
bool g_forked_child = false;

// The simulator's fault injection, looked up at run time: the real driver has none.
std::string Inject(const std::string& name, unsigned nth, int code) {
  using InjectFn = int (*)(const char*, unsigned, int);
  auto fn = reinterpret_cast<InjectFn>(dlsym(RTLD_DEFAULT, "simcuda_inject_failure"));
  if (fn == nullptr) return "err not the simulated driver";
  return fn(name.c_str(), nth, code) == 0 ? "ok" : "err bad injection";
}

// The simulator's injected delay (simcuda_inject_delay), looked up at run time.
std::string InjectDelay(const std::string& name, unsigned nth, unsigned ms) {
  using DelayFn = int (*)(const char*, unsigned, unsigned);
  auto fn = reinterpret_cast<DelayFn>(dlsym(RTLD_DEFAULT, "simcuda_inject_delay"));
  if (fn == nullptr) return "err not the simulated driver";
  return fn(name.c_str(), nth, ms) == 0 ? "ok" : "err bad injection";
}

// The simulator's delay after the call's work (simcuda_inject_delay_after).
std::string InjectDelayAfter(const std::string& name, unsigned nth, unsigned ms) {
  using DelayFn = int (*)(const char*, unsigned, unsigned);
  auto fn = reinterpret_cast<DelayFn>(dlsym(RTLD_DEFAULT, "simcuda_inject_delay_after"));
  if (fn == nullptr) return "err not the simulated driver";
  return fn(name.c_str(), nth, ms) == 0 ? "ok" : "err bad injection";
}

// One chunk of `chunk` bytes mapped past vmmipc's cuMemMap hook (the
// simulator's simcuda_mem_map), as memory mapped before vmmipc was loaded:
// every request for it exports it anew (the describe step).
std::string AllocVmmUntracked(const std::string& name, uint64_t chunk) {
  using MapFn = int (*)(uint64_t, uint64_t, uint64_t, uint64_t);
  auto map_unhooked = reinterpret_cast<MapFn>(dlsym(RTLD_DEFAULT, "simcuda_mem_map"));
  if (map_unhooked == nullptr) return "err not the simulated driver";
  VmmBuffer buf;
  buf.reserved = chunk;
  buf.chunk = chunk;
  CUresult r = cuMemAddressReserve(&buf.base, buf.reserved, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle handle = 0;
  if ((r = cuMemCreate(&handle, chunk, &prop, 0)) != CUDA_SUCCESS) return Err(r);
  if ((r = static_cast<CUresult>(map_unhooked(buf.base, chunk, 0, handle))) != CUDA_SUCCESS)
    return Err(r);
  buf.handles.push_back(handle);
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = g_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = cuMemSetAccess(buf.base, chunk, &access, 1)) != CUDA_SUCCESS) return Err(r);
  g_vmm[name] = buf;
  return "ok " + Hex(buf.base);
}

// Two chunks of `chunk` bytes back to back in one reservation, the second
// mapped from offset `chunk` of an allocation twice its size (today's driver
// refuses a non-zero offset; the simulator and a later driver may not). With
// `untracked`, the first is mapped past vmmipc's cuMemMap hook (the
// simulator's simcuda_mem_map), as memory mapped before vmmipc was loaded.
std::string AllocVmmOffset(const std::string& name, uint64_t chunk, bool untracked) {
  using MapFn = int (*)(uint64_t, uint64_t, uint64_t, uint64_t);
  auto map_unhooked = reinterpret_cast<MapFn>(dlsym(RTLD_DEFAULT, "simcuda_mem_map"));
  if (untracked && map_unhooked == nullptr) return "err not the simulated driver";
  VmmBuffer buf;
  buf.reserved = 2 * chunk;
  buf.chunk = chunk;
  CUresult r = cuMemAddressReserve(&buf.base, buf.reserved, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle first = 0, second = 0;
  if ((r = cuMemCreate(&first, chunk, &prop, 0)) != CUDA_SUCCESS) return Err(r);
  r = untracked ? static_cast<CUresult>(map_unhooked(buf.base, chunk, 0, first))
                : cuMemMap(buf.base, chunk, 0, first, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  buf.handles.push_back(first);
  if ((r = cuMemCreate(&second, 2 * chunk, &prop, 0)) != CUDA_SUCCESS) return Err(r);
  if ((r = cuMemMap(buf.base + chunk, chunk, chunk, second, 0)) != CUDA_SUCCESS) return Err(r);
  buf.handles.push_back(second);
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = g_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = cuMemSetAccess(buf.base, 2 * chunk, &access, 1)) != CUDA_SUCCESS) return Err(r);
  g_vmm[name] = buf;  // free_vmm unmaps and releases both
  return "ok " + Hex(buf.base);
}

// Sets RLIMIT_NOFILE's soft limit so that exactly `free_fds` more descriptors can be
// opened (new fds take the lowest free numbers below the limit). Answers the limit.
std::string Headroom(uint64_t free_fds) {
  std::vector<uint64_t> open;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return "err opendir";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != dirfd(d)) open.push_back(static_cast<uint64_t>(fd));
  }
  closedir(d);
  std::sort(open.begin(), open.end());
  uint64_t limit = 0;
  size_t below = 0;  // open fds < limit
  while (limit - below != free_fds) {
    ++limit;
    while (below < open.size() && open[below] < limit) ++below;
  }
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = limit;
  return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? "ok " + std::to_string(limit) : "err setrlimit";
}

// "seed:size:hex" <-> what one thread of thread_opens needs.
struct SharedBuffer {
  uint64_t seed = 0;
  uint64_t size = 0;
  CUipcMemHandle handle = {};
};

bool ParseSharedBuffer(const std::string& spec, SharedBuffer* out) {
  const size_t a = spec.find(':'), b = spec.find(':', a + 1);
  if (a == std::string::npos || b == std::string::npos) return false;
  out->seed = Num(spec.substr(0, a));
  out->size = Num(spec.substr(a + 1, b - a - 1));
  return HexToHandle(spec.substr(b + 1), &out->handle);
}

// nthreads threads, iters opens each over the given buffers; every open is checked
// (first and last 4 KiB against the buffer's pattern) and closed after the thread's
// next open, so opens of one handle overlap across threads.
std::string ThreadOpens(int nthreads, int iters, const std::vector<SharedBuffer>& buffers,
                        IpcFns* fns) {
  std::atomic<int> opens{0}, failures{0}, mismatches{0};
  std::mutex mu;
  std::string first_error;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = what;
  };
  auto worker = [&](int t) {
    cuCtxSetCurrent(g_context);  // a context is per thread
    CUdeviceptr previous = 0;
    for (int i = 0; i < iters; ++i) {
      const SharedBuffer& b = buffers[(static_cast<size_t>(i) * 7 + t) % buffers.size()];
      CUdeviceptr p = 0;
      CUresult r = fns->open(&p, b.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      if (r != CUDA_SUCCESS) {
        ++failures;
        note("open: " + Err(r));
        continue;
      }
      ++opens;
      const uint64_t tail = b.size >= 4096 ? b.size - 4096 : 0;
      std::string head = Check(p, std::min<uint64_t>(4096, b.size), b.seed, 0);
      std::string end = Check(p + tail, std::min<uint64_t>(4096, b.size), b.seed, tail);
      if (head != "ok" || end != "ok") {
        ++mismatches;
        note("check: " + head + " / " + end);
      }
      if (previous != 0 && (r = fns->close(previous)) != CUDA_SUCCESS) {
        ++failures;
        note("close: " + Err(r));
      }
      previous = p;
    }
    if (previous != 0 && fns->close(previous) != CUDA_SUCCESS) ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  std::string out = "ok opens=" + std::to_string(opens) + " failures=" + std::to_string(failures) +
                    " mismatches=" + std::to_string(mismatches);
  return first_error.empty() ? out : out + " first_error=" + first_error;
}

// nthreads threads each export every address rounds times, in rotated orders; all
// handles of one address must be identical. Answers one handle per address.
std::string ThreadGets(int nthreads, int rounds, const std::vector<uint64_t>& addresses,
                       IpcFns* fns) {
  std::vector<std::vector<std::string>> seen(nthreads, std::vector<std::string>(addresses.size()));
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    cuCtxSetCurrent(g_context);
    for (int round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < addresses.size(); ++k) {
        const size_t i = (k + t + round) % addresses.size();
        CUipcMemHandle h = {};
        CUresult r = fns->get(&h, addresses[i]);
        if (r != CUDA_SUCCESS) {
          ++failures;
          continue;
        }
        const std::string hex = HandleToHex(h);
        if (!seen[t][i].empty() && seen[t][i] != hex) ++failures;
        seen[t][i] = hex;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  if (failures != 0) return "err failures=" + std::to_string(failures);
  std::string out = "ok";
  for (size_t i = 0; i < addresses.size(); ++i) {
    for (int t = 1; t < nthreads; ++t)
      if (seen[t][i] != seen[0][i]) return "err threads disagree on address " + Hex(addresses[i]);
    out += " " + seen[0][i];
  }
  return out;
}

// Allocates, fills and exports one VMM buffer of `chunks` 2 MiB chunks without g_vmm
// (safe from any thread); the buffer lives until the process exits.
std::string AllocFillGet(uint64_t chunks, uint64_t seed, IpcFns* fns, uint64_t* base_out) {
  const uint64_t chunk = 2ull << 20;
  CUdeviceptr base = 0;
  CUresult r = cuMemAddressReserve(&base, chunk * chunks, 0, 0, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  for (uint64_t i = 0; i < chunks; ++i) {
    CUmemGenericAllocationHandle h = 0;
    if ((r = cuMemCreate(&h, chunk, &prop, 0)) != CUDA_SUCCESS) return Err(r);
    if ((r = cuMemMap(base + i * chunk, chunk, 0, h, 0)) != CUDA_SUCCESS) return Err(r);
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = g_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = cuMemSetAccess(base, chunk * chunks, &access, 1)) != CUDA_SUCCESS) return Err(r);
  std::string filled = Fill(base, chunk * chunks, seed);
  if (filled != "ok") return filled;
  CUipcMemHandle h = {};
  if ((r = fns->get(&h, base)) != CUDA_SUCCESS) return Err(r);
  if (base_out != nullptr) *base_out = base;
  return "ok " + HandleToHex(h);
}

// Each of nthreads threads allocates, fills (seed 200 + t) and exports its own buffer
// at the same time. Answers "seed:size:hex" per thread, for thread_opens.
std::string ThreadExports(int nthreads, uint64_t chunks, IpcFns* fns) {
  std::vector<std::string> answers(nthreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      cuCtxSetCurrent(g_context);
      answers[t] = AllocFillGet(chunks, 200 + t, fns, nullptr);
    });
  }
  for (auto& th : threads) th.join();
  std::string out = "ok";
  for (int t = 0; t < nthreads; ++t) {
    if (answers[t].rfind("ok ", 0) != 0)
      return "err thread " + std::to_string(t) + ": " + answers[t];
    out += " " + std::to_string(200 + t) + ":" + Hex(chunks * (2ull << 20)) + ":" +
           answers[t].substr(3);
  }
  return out;
}

// Reads one line from `fd` within timeout_ms ("" on timeout or EOF).
std::string ReadLineFrom(int fd, int timeout_ms) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (line.empty() || line.back() != '\n') {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return "";
    char c;
    if (read(fd, &c, 1) != 1) return "";
    line += c;
  }
  line.pop_back();
  return line;
}

// Waits up to timeout_ms for `pid`; "exit=N", "signal=N", or "hung" (then killed).
std::string WaitChild(pid_t pid, int timeout_ms) {
  int status = 0;
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? "exit=" + std::to_string(WEXITSTATUS(status))
                               : "signal=" + std::to_string(WTERMSIG(status));
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return "hung";
}

std::map<pid_t, int> g_children;  // forked child -> write end of the pipe that holds it

// Forks a child that allocates, fills and exports its own buffer (a fresh listener
// under its own pid), answers "ok <pid> <hex>", then serves until `reap` (or until
// this process dies) and leaves through exit() (static destructors and all).
std::string ForkExport(uint64_t chunks, uint64_t seed, IpcFns* fns) {
  int result[2], hold[2];
  if (pipe2(result, O_CLOEXEC) != 0) return "err pipe";
  if (pipe2(hold, O_CLOEXEC) != 0) return "err pipe";
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) return "err fork";
  if (pid == 0) {
    g_forked_child = true;
    alarm(120);  // never outlive a broken test
    close(result[0]);
    close(hold[1]);
    std::string answer = AllocFillGet(chunks, seed, fns, nullptr);
    if (answer.rfind("ok ", 0) == 0) answer = "ok " + std::to_string(getpid()) + answer.substr(2);
    answer += "\n";
    (void)!write(result[1], answer.data(), answer.size());
    char c;
    while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
    }
    std::exit(0);
  }
  close(result[1]);
  close(hold[0]);
  std::string answer = ReadLineFrom(result[0], 20000);
  close(result[0]);
  g_children[pid] = hold[1];
  return answer.empty() ? "err the child did not answer" : answer;
}

std::string Reap(pid_t pid) {
  auto it = g_children.find(pid);
  if (it == g_children.end()) return "err not a child of this peer";
  close(it->second);
  g_children.erase(it);
  return "ok " + WaitChild(pid, 20000);
}

// Forks n children, one after another, while whatever else runs in this process goes
// on (the listener serving an importer); each child logs through vmmipc (a malformed
// VMM2 handle: no driver call) and exit()s, under a 10 s alarm. Answers how they ended.
std::string ForkStorm(int n, IpcFns* fns) {
  vmmipc::ledger::Vmm2Handle malformed;
  malformed.pid = 1;
  malformed.capability = 0;  // capability 0: refused by the decoder, with a warning line
  malformed.chunk_size = 1;
  CUipcMemHandle h = {};
  vmmipc::ledger::EncodeHandle(malformed, reinterpret_cast<unsigned char*>(h.reserved));
  int exited = 0;
  std::string other;
  std::cout.flush();
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) return "err fork";
    if (pid == 0) {
      g_forked_child = true;
      alarm(10);
      CUdeviceptr p = 0;
      const CUresult r = fns->open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      std::exit(r == CUDA_ERROR_INVALID_VALUE ? 0 : 3);
    }
    const std::string how = WaitChild(pid, 15000);
    if (how == "exit=0")
      ++exited;
    else
      other += " " + how;
  }
  return "ok exited=" + std::to_string(exited) + (other.empty() ? "" : " other:" + other);
}

// The memfds this process holds (the simulated driver's chunks: its own
// handles' and any fd of a peer's chunk it keeps).
int MemfdCount() {
  int count = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string link = "/proc/self/fd/" + std::string(e->d_name);
    if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target).rfind("/memfd:", 0) == 0)
      ++count;
  }
  closedir(d);
  return count;
}

// The exported fds this process holds: its memfds (the simulated driver's
// chunks and every fd exported of them) less the simulator's own.
int ExportedFdCount() {
  using StatsFn = int (*)(SimCudaStats*);
  auto fn = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "simcuda_get_stats"));
  SimCudaStats stats = {};
  if (fn == nullptr || fn(&stats) != 0) return -1;
  return MemfdCount() - static_cast<int>(stats.open_fds);
}

// "ok PARENT CHILD": the exported fds (ExportedFdCount) of a child forked now,
// counted in it right after the fork (the fork handlers have run), and of
// this process once the child has answered.
std::string ForkExportedFds() {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "err pipe";
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) return "err fork";
  if (pid == 0) {
    const std::string count = std::to_string(ExportedFdCount()) + "\n";
    (void)!write(out[1], count.data(), count.size());
    _exit(0);
  }
  close(out[1]);
  const std::string child = ReadLineFrom(out[0], 20000);
  close(out[0]);
  WaitChild(pid, 20000);
  return "ok " + std::to_string(ExportedFdCount()) + " " + child;
}

// "ok PARENT CHILD": the memfds of this process, and of a child forked now,
// counted in the child right after the fork (the fork handlers have run).
std::string ForkMemfds() {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "err pipe";
  const int parent = MemfdCount();
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) return "err fork";
  if (pid == 0) {
    const std::string count = std::to_string(MemfdCount()) + "\n";
    (void)!write(out[1], count.data(), count.size());
    _exit(0);
  }
  close(out[1]);
  const std::string child = ReadLineFrom(out[0], 20000);
  close(out[0]);
  WaitChild(pid, 20000);
  return "ok " + std::to_string(parent) + " " + child;
}

// Every descriptor of this process except 0-2 that lacks FD_CLOEXEC, as fd=target.
std::string CloexecAudit() {
  std::string leaks;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return "err opendir";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(d)) continue;
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) {
      char target[256] = {};
      const std::string link = "/proc/self/fd/" + std::string(e->d_name);
      (void)!readlink(link.c_str(), target, sizeof(target) - 1);
      leaks += " " + std::string(e->d_name) + "=" + target;
    }
  }
  closedir(d);
  return "ok" + leaks;
}

// Execs `ls -l /proc/self/fd/` in a forked child (clean environment) and answers the
// descriptors it found, as fd=target: what any exec'd program inherits from us.
std::string ExecFds() {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "err pipe";
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) return "err fork";
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    char* const argv[] = {const_cast<char*>("ls"), const_cast<char*>("-l"),
                          const_cast<char*>("/proc/self/fd/"), nullptr};
    char* const envp[] = {nullptr};
    execve("/bin/ls", argv, envp);
    _exit(127);
  }
  close(out[1]);
  std::string text;
  for (;;) {
    pollfd p = {out[0], POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) break;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  const std::string how = WaitChild(pid, 10000);
  if (how != "exit=0") return "err ls " + how;
  std::string fds;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t arrow = line.find(" -> ");
    if (arrow == std::string::npos) continue;
    const size_t name = line.rfind(' ', arrow - 1);
    fds += " " + line.substr(name + 1, arrow - name - 1) + "=" + line.substr(arrow + 4);
  }
  return "ok" + fds;
}

// Becomes another user for good (from root): the other-uid client of the tests.
std::string DropTo(uint32_t uid) {
  if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    return std::string("err ") + std::strerror(errno);
  return "ok";
}

// The commands above, by name; false when `a` is none of them.
bool FaultCommand(const std::vector<std::string>& a, IpcFns* fns, std::string* reply) {
  const std::string& cmd = a[0];
  if (cmd == "inject") {  // name nth code: the simulator's nth next `name` call fails with code
    *reply = Inject(a.at(1), static_cast<unsigned>(Num(a.at(2))), static_cast<int>(Num(a.at(3))));
  } else if (cmd == "inject_delay") {  // name nth ms: the nth next `name` call waits ms first
    *reply = InjectDelay(a.at(1), static_cast<unsigned>(Num(a.at(2))),
                         static_cast<unsigned>(Num(a.at(3))));
  } else if (cmd == "inject_delay_after") {  // name nth ms: the nth next `name` waits ms after
    *reply = InjectDelayAfter(a.at(1), static_cast<unsigned>(Num(a.at(2))),
                              static_cast<unsigned>(Num(a.at(3))));
  } else if (cmd == "alloc_vmm_untracked") {  // name chunk: one chunk vmmipc did not see mapped
    *reply = AllocVmmUntracked(a.at(1), Num(a.at(2)));
  } else if (cmd == "fork_exported_fds") {
    *reply = ForkExportedFds();
  } else if (cmd == "alloc_vmm_offset") {  // name chunk [untracked]: chunk 1 at a non-zero offset
    *reply = AllocVmmOffset(a.at(1), Num(a.at(2)), a.size() > 3 && a[3] == "untracked");
  } else if (cmd == "headroom") {  // n: exactly n more fds can be opened
    *reply = Headroom(Num(a.at(1)));
  } else if (cmd == "nofile_max") {  // soft RLIMIT_NOFILE back up to the hard one
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    *reply =
        setrlimit(RLIMIT_NOFILE, &rl) == 0 ? "ok " + std::to_string(rl.rlim_cur) : "err setrlimit";
  } else if (cmd == "redirect_stderr") {  // path: this process's stderr (vmmipc's log) goes there
    const int fd = open(a.at(1).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    *reply = fd >= 0 && dup2(fd, STDERR_FILENO) == STDERR_FILENO ? "ok" : "err open";
    if (fd >= 0) close(fd);
  } else if (cmd == "same_open") {  // nthreads hex: every thread opens one handle at once
    CUipcMemHandle h = {};
    const int threads = static_cast<int>(Num(a.at(1)));
    if (!HexToHandle(a.at(2), &h) || threads < 1 || threads > 64) {
      *reply = "err bad arguments";
      return true;
    }
    std::vector<CUdeviceptr> pointers(threads, 0);
    std::vector<CUresult> results(threads, CUDA_SUCCESS);
    std::atomic<int> ready{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        cuCtxSetCurrent(g_context);  // a context is per thread
        ++ready;
        while (ready < threads) {
        }
        results[t] = fns->open(&pointers[t], h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      });
    for (auto& w : workers) w.join();
    std::set<CUdeviceptr> distinct;
    std::string error;
    for (int t = 0; t < threads; ++t) {
      if (results[t] != CUDA_SUCCESS)
        error = Err(results[t]);
      else
        distinct.insert(pointers[t]);
    }
    // Every open needs its close.
    for (int t = 0; t < threads; ++t)
      if (results[t] == CUDA_SUCCESS) fns->close(pointers[t]);
    *reply = !error.empty() ? error : "ok " + std::to_string(distinct.size());
  } else if (cmd == "thread_opens") {  // nthreads iters seed:size:hex...
    std::vector<SharedBuffer> buffers;
    for (size_t i = 3; i < a.size(); ++i) {
      SharedBuffer b;
      if (!ParseSharedBuffer(a[i], &b)) {
        *reply = "err bad buffer " + a[i];
        return true;
      }
      buffers.push_back(b);
    }
    *reply = buffers.empty() ? "err no buffers"
                             : ThreadOpens(static_cast<int>(Num(a.at(1))),
                                           static_cast<int>(Num(a.at(2))), buffers, fns);
  } else if (cmd == "thread_gets") {  // nthreads rounds addr...
    std::vector<uint64_t> addresses;
    for (size_t i = 3; i < a.size(); ++i) addresses.push_back(Num(a[i]));
    *reply =
        ThreadGets(static_cast<int>(Num(a.at(1))), static_cast<int>(Num(a.at(2))), addresses, fns);
  } else if (cmd == "thread_exports") {  // nthreads chunks
    *reply = ThreadExports(static_cast<int>(Num(a.at(1))), Num(a.at(2)), fns);
  } else if (cmd == "fork_export") {  // chunks seed
    *reply = ForkExport(Num(a.at(1)), Num(a.at(2)), fns);
  } else if (cmd == "reap") {  // pid
    *reply = Reap(static_cast<pid_t>(Num(a.at(1))));
  } else if (cmd == "fork_storm") {  // n
    *reply = ForkStorm(static_cast<int>(Num(a.at(1))), fns);
  } else if (cmd == "fork_open") {  // hex seed size: a forked child opens, checks and closes
    std::cout.flush();
    const pid_t pid = fork();
    if (pid == 0) {
      g_forked_child = true;
      alarm(30);
      std::string r = Run({"open", a.at(1)}, fns);
      if (r.rfind("ok ", 0) != 0) std::exit(2);
      const std::string p = r.substr(3);
      if (Check(Num(p), Num(a.at(3)), Num(a.at(2)), 0) != "ok") std::exit(3);
      std::exit(Run({"close", p}, fns) == "ok" ? 0 : 4);
    }
    *reply = pid < 0 ? "err fork" : "ok " + WaitChild(pid, 40000);
  } else if (cmd == "fork_memfds") {
    *reply = ForkMemfds();
  } else if (cmd == "cloexec_audit") {
    *reply = CloexecAudit();
  } else if (cmd == "exec_fds") {
    *reply = ExecFds();
  } else if (cmd == "drop_to") {  // uid
    *reply = DropTo(static_cast<uint32_t>(Num(a.at(1))));
  } else {
    return false;
  }
  return true;
}

// Driver entry points the simulated driver lacks (streams, graphs, peer
// copies), found at run time so the peer still links against it.
template <typename Fn>
Fn RealOnly(const char* name) {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return lib != nullptr ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

// A captured graph and the stream it replays on.
struct CapturedGraph {
  CUstream stream = nullptr;
  CUgraphExec exec = nullptr;
};
std::map<std::string, CapturedGraph> g_graphs;

// Captures a graph that copies [src, src + size) to dst on a fresh stream and
// instantiates it, as `name`: what a graph over peer pointers does.
std::string GraphCapture(const std::string& name, uint64_t dst, uint64_t src, uint64_t size) {
  using StreamCreate = CUresult (*)(CUstream*, unsigned);
  using BeginCapture = CUresult (*)(CUstream, CUstreamCaptureMode);
  using CopyAsync = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  using EndCapture = CUresult (*)(CUstream, CUgraph*);
  using Instantiate = CUresult (*)(CUgraphExec*, CUgraph, unsigned long long);
  auto create = RealOnly<StreamCreate>("cuStreamCreate");
  auto begin = RealOnly<BeginCapture>("cuStreamBeginCapture_v2");
  auto copy = RealOnly<CopyAsync>("cuMemcpyDtoDAsync_v2");
  auto end = RealOnly<EndCapture>("cuStreamEndCapture");
  auto instantiate = RealOnly<Instantiate>("cuGraphInstantiateWithFlags");
  if (!create || !begin || !copy || !end || !instantiate) return "err unsupported by this driver";
  CapturedGraph captured;
  CUgraph graph = nullptr;
  CUresult r = create(&captured.stream, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = begin(captured.stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
  if (r == CUDA_SUCCESS) r = copy(dst, src, size, captured.stream);
  if (r == CUDA_SUCCESS) r = end(captured.stream, &graph);
  if (r == CUDA_SUCCESS) r = instantiate(&captured.exec, graph, 0);
  if (r != CUDA_SUCCESS) return Err(r);
  g_graphs[name] = captured;
  return "ok";
}

// Launches the graph captured as `name` `times` times and synchronizes.
std::string GraphLaunch(const std::string& name, int times) {
  using Launch = CUresult (*)(CUgraphExec, CUstream);
  using Sync = CUresult (*)(CUstream);
  auto launch = RealOnly<Launch>("cuGraphLaunch");
  auto sync = RealOnly<Sync>("cuStreamSynchronize");
  if (!launch || !sync) return "err unsupported by this driver";
  auto it = g_graphs.find(name);
  if (it == g_graphs.end()) return "err no such graph";
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; r == CUDA_SUCCESS && i < times; ++i)
    r = launch(it->second.exec, it->second.stream);
  if (r == CUDA_SUCCESS) r = sync(it->second.stream);
  return r == CUDA_SUCCESS ? "ok" : Err(r);
}

// Captures a copy of [src, src + size) to dst, launches it twice and synchronizes.
std::string GraphCopy(uint64_t dst, uint64_t src, uint64_t size) {
  const std::string captured = GraphCapture("", dst, src, size);
  return captured == "ok" ? GraphLaunch("", 2) : captured;
}

std::string MedianGbps(std::vector<double> seconds, uint64_t size) {
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ok %.1f", static_cast<double>(size) / median / 1e9);
  return buf;
}

std::string Bandwidth(uint64_t dst, uint64_t src, uint64_t size, int iterations) {
  std::vector<double> seconds;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CUresult r = cuMemcpyDtoD(dst, src, size);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) return Err(r);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return MedianGbps(seconds, size);
}

// cuMemcpyPeer between cuMemAlloc buffers on devices 1 and 0 of this process:
// the reference an NVLink copy through an imported mapping is compared with.
std::string PeerBandwidth(uint64_t size, int iterations) {
  using CopyPeer = CUresult (*)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
  auto copy_peer = RealOnly<CopyPeer>("cuMemcpyPeer");
  if (copy_peer == nullptr) return "err unsupported by this driver";
  CUdevice d0 = 0, d1 = 0;
  CUcontext c0 = nullptr, c1 = nullptr;
  CUresult r = cuDeviceGet(&d0, 0);
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&d1, 1);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&c0, d0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&c1, d1);
  CUdeviceptr p0 = 0, p1 = 0;
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(c1);
  if (r == CUDA_SUCCESS) r = cuMemAlloc(&p1, size);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(c0);
  if (r == CUDA_SUCCESS) r = cuMemAlloc(&p0, size);
  if (r != CUDA_SUCCESS) return Err(r);
  std::vector<double> seconds;
  for (int i = 0; r == CUDA_SUCCESS && i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    r = copy_peer(p0, c0, p1, c1, size);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  cuMemFree(p0);
  cuCtxSetCurrent(c1);
  cuMemFree(p1);
  cuCtxSetCurrent(g_context);
  return r == CUDA_SUCCESS ? MedianGbps(seconds, size) : Err(r);
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
  if (cmd == "uid") return "ok " + std::to_string(geteuid());  // as the peer sees itself
  // code: exit() from here, not a return from main (atexit handlers run either way).
  if (cmd == "exit_now") std::exit(a.size() > 1 ? static_cast<int>(Num(a[1])) : 0);
  if (cmd == "alloc_vmm")  // name chunk count [extra] [noposix]
    return AllocVmm(a.at(1), Num(a.at(2)), Num(a.at(3)), a.size() > 4 ? Num(a[4]) : 0,
                    !(a.size() > 5 && a[5] == "noposix"));
  if (cmd == "free_vmm") return FreeVmm(a.at(1));
  if (cmd == "pause") return PauseVmm(a.at(1));  // name: unmap + release, the reservation kept
  if (cmd == "resume")  // name [chunk]: create + map + set access again (one chunk if resized)
    return ResumeVmm(a.at(1), a.size() > 2 ? Num(a[2]) : 0);
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
  if (cmd == "open_repeat") {  // n hex: n opens one after another, as an application's retries
    CUipcMemHandle h = {};
    const uint64_t n = Num(a.at(1));
    if (!HexToHandle(a.at(2), &h)) return "err bad hex";
    // "ok <result> x<count> ..." per distinct result, then "ms <elapsed>";
    // a successful open is closed again before the next.
    std::map<std::string, uint64_t> results;
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      CUdeviceptr p = 0;
      const CUresult r = fns->open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      if (r == CUDA_SUCCESS) fns->close(p);
      const char* name = nullptr;
      if (r == CUDA_SUCCESS)
        ++results["ok"];
      else if (cuGetErrorName(r, &name) == CUDA_SUCCESS && name != nullptr)
        ++results[name];
      else
        ++results["error " + std::to_string(static_cast<int>(r))];
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    std::string reply = "ok";
    for (const auto& [result, count] : results)
      reply += " " + result + " x" + std::to_string(count);
    return reply + " ms " + std::to_string(ms);
  }
  if (cmd == "open_bg") {  // hex [name]: starts an open on another thread; open_bg_result joins it
    CUipcMemHandle h = {};
    if (!HexToHandle(a.at(1), &h)) return "err bad hex";
    const std::string name = a.size() > 2 ? a[2] : "";
    if (g_background_open[name].joinable()) return "err an open_bg is running";
    g_background_open[name] = std::thread([h, fns, name] {
      cuCtxSetCurrent(g_context);  // a context is per thread
      CUdeviceptr p = 0;
      const CUresult r = fns->open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      const std::string result = r == CUDA_SUCCESS ? "ok " + Hex(p) : Err(r);
      std::lock_guard<std::mutex> lock(g_background_mutex);
      g_background_result[name] = result;
    });
    return "ok";
  }
  if (cmd == "open_bg_result") {  // [name]
    const std::string name = a.size() > 1 ? a[1] : "";
    if (!g_background_open[name].joinable()) return "err no open_bg";
    g_background_open[name].join();
    std::lock_guard<std::mutex> lock(g_background_mutex);
    return g_background_result[name];
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
    vmmipc::ledger::Vmm2Handle h;
    auto status =
        vmmipc::ledger::DecodeHandle(reinterpret_cast<const unsigned char*>(raw.reserved), &h);
    if (status != vmmipc::ledger::DecodeStatus::kOk)
      return std::string("err ") + vmmipc::ledger::DecodeStatusName(status);
    std::ostringstream out;
    out << "ok version=" << int(h.version) << " rank_slot="
        << (h.rank_slot == vmmipc::ledger::kUnranked ? std::string("unranked")
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
    return next == dflt ? "ok"
                        : "err next=" + Hex(reinterpret_cast<uint64_t>(next)) +
                              " default=" + Hex(reinterpret_cast<uint64_t>(dflt));
  }
  if (cmd == "load_late") {  // path: dlopen it with a second thread already running
    static int hold[2] = {-1, -1};
    if (hold[0] < 0 && pipe2(hold, O_CLOEXEC) != 0) return "err pipe";
    std::thread([] {
      char c;
      (void)!read(hold[0], &c, 1);  // never written: runs until exit
    }).detach();
    return dlopen(a.at(1).c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr ? "ok" : "err dlopen";
  }
  if (cmd == "devices") {
    int count = 0;
    CUresult r = cuDeviceGetCount(&count);
    return r == CUDA_SUCCESS ? "ok " + std::to_string(count) : Err(r);
  }
  if (cmd == "graph_copy") return GraphCopy(Num(a.at(1)), Num(a.at(2)), Num(a.at(3)));
  if (cmd == "graph_capture")  // name dst src size: a copy captured in a graph, kept
    return GraphCapture(a.at(1), Num(a.at(2)), Num(a.at(3)), Num(a.at(4)));
  if (cmd == "graph_launch")  // name: replays it once and synchronizes
    return GraphLaunch(a.at(1), 1);
  if (cmd == "bandwidth")  // dst src size iterations: GB/s of cuMemcpyDtoD, median
    return Bandwidth(Num(a.at(1)), Num(a.at(2)), Num(a.at(3)), std::stoi(a.at(4)));
  if (cmd == "peer_bandwidth")  // size iterations: cuMemcpyPeer device 1 -> device 0
    return PeerBandwidth(Num(a.at(1)), std::stoi(a.at(2)));
  if (std::string reply; FaultCommand(a, fns, &reply)) return reply;
  if (std::string reply; vmmipc::testing::RawFollowerCommand(a, &reply)) return reply;
  return "err unknown command " + cmd;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer's hook: no leak check in forked children (see g_forked_child).
extern "C" int __lsan_is_turned_off() { return g_forked_child ? 1 : 0; }
#endif

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "probe") {
    // Exit 0 with a device, 77 without: the tests' skip signal.
    int count = 0;
    return cuInit(0) == CUDA_SUCCESS && cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0 ? 0
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
