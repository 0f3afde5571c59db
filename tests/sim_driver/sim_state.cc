// Simulated CUDA driver: state tables, shared helpers, environment, introspection and faults.
#include "sim_state.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "sim_introspect.h"

namespace simcuda {
namespace {

uint64_t RandomToken() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != sizeof(v)) {
    v = (static_cast<uint64_t>(getpid()) << 32) ^ reinterpret_cast<uintptr_t>(&v);
  }
  return v | 1;  // never zero
}

void AtforkPrepare() { St().mu.lock(); }
void AtforkParent() { St().mu.unlock(); }
void AtforkChild() {
  State& s = St();
  s.token = RandomToken();  // the child is another exporter
  s.mu.unlock();
}

State* MakeState() {
  auto* s = new State();
  for (int d = 0; d < kMaxDevices; ++d) s->primary_ctx[d].device = d;
  s->token = RandomToken();
  pthread_atfork(AtforkPrepare, AtforkParent, AtforkChild);
  return s;
}

// Parses an unsigned decimal; false if `text` is not one.
bool ParseUnsigned(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

void SetFault(State& s, std::string_view name, unsigned int nth, CUresult code) {
  for (auto it = s.faults.begin(); it != s.faults.end(); ++it) {
    if (it->name == name) {
      s.faults.erase(it);
      break;
    }
  }
  if (nth > 0) s.faults.push_back(Fault{std::string(name), nth, code});
}

}  // namespace

State& St() {
  static State* state = MakeState();
  return *state;
}

CUcontext& CurrentCtx() {
  thread_local CUcontext current = nullptr;
  return current;
}

std::vector<CUcontext>& CtxStack() {
  thread_local std::vector<CUcontext> stack;
  return stack;
}

CUresult CheckInit(const State& s) {
  if (s.torn_down) return CUDA_ERROR_DEINITIALIZED;
  return s.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

void TearDownAtExit() {
  State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  s.torn_down = true;
  if (s.delayed_calls == 0) return;
  char line[128];
  const int n =
      snprintf(line, sizeof(line), "simcuda: torn down at exit while %d call(s) were in progress\n",
               s.delayed_calls);
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(n));
  _exit(139);  // not raise(SIGSEGV): a sanitizer's handler would report it as its own
}

CUresult Enter(State& s, const char* name) {
  if (CUresult r = CheckInit(s); r != CUDA_SUCCESS) return r;
  for (auto it = s.faults.begin(); it != s.faults.end(); ++it) {
    if (it->name != name) continue;
    if (--it->countdown > 0) return CUDA_SUCCESS;
    CUresult code = it->code;
    s.faults.erase(it);
    return code;
  }
  return CUDA_SUCCESS;
}

namespace {

void DelayIfAsked(State& s, const char* name, bool after) {
  unsigned int ms = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto it = s.delays.begin(); it != s.delays.end(); ++it) {
      if (it->name != name || it->after != after) continue;
      if (--it->countdown > 0) return;
      ms = it->ms;
      s.delays.erase(it);
      break;
    }
  }
  if (ms == 0) return;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.delayed_calls;  // in progress: a teardown now crashes (TearDownAtExit)
  }
  usleep(ms * 1000u);
  std::lock_guard<std::mutex> lock(s.mu);
  --s.delayed_calls;
}

}  // namespace

void DelayIfAsked(State& s, const char* name) { DelayIfAsked(s, name, false); }
void DelayAfterIfAsked(State& s, const char* name) { DelayIfAsked(s, name, true); }

bool ValidDevice(const State& s, int dev) { return dev >= 0 && dev < s.device_count; }

int CurrentDevice(const State& s) {
  CUcontext ctx = CurrentCtx();
  if (ctx == nullptr || !ValidDevice(s, ctx->device)) return -1;
  return ctx->device;
}

void LoadEnvironment(State& s) {
  uint64_t v = 0;
  s.device_count = 1;
  if (const char* e = std::getenv("SIMCUDA_DEVICE_COUNT"); e != nullptr && ParseUnsigned(e, &v)) {
    s.device_count = v > kMaxDevices ? kMaxDevices : static_cast<int>(v);
  }
  // CUDA_VISIBLE_DEVICES, as the real driver reads it: a comma list of host
  // indices, cut at the first entry that is not a valid, unused index; set
  // but empty, no device at all. (UUIDs and MIG names are not simulated.)
  if (const char* e = std::getenv("CUDA_VISIBLE_DEVICES"); e != nullptr) {
    const int host_count = s.device_count;
    int visible = 0;
    std::string_view rest(e);
    while (!rest.empty() && visible < host_count) {
      const size_t comma = rest.find(',');
      const std::string item(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      uint64_t index = 0;
      if (!ParseUnsigned(item.c_str(), &index) || index >= static_cast<uint64_t>(host_count)) break;
      bool repeated = false;
      for (int i = 0; i < visible; ++i) repeated |= s.host_index[i] == static_cast<int>(index);
      if (repeated) break;
      s.host_index[visible++] = static_cast<int>(index);
    }
    s.device_count = visible;
  }
  if (const char* e = std::getenv("SIMCUDA_TOTAL_MEM_MIB"); e != nullptr && ParseUnsigned(e, &v)) {
    if (v > 0 && v < (uint64_t{1} << 30)) s.total_mem = static_cast<size_t>(v) << 20;
  }
  // SIMCUDA_FAIL=name:nth:code[,name:nth:code...]; malformed entries are ignored.
  if (const char* e = std::getenv("SIMCUDA_FAIL"); e != nullptr) {
    std::string_view rest(e);
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      size_t c1 = item.find(':');
      if (c1 == std::string_view::npos) continue;
      size_t c2 = item.find(':', c1 + 1);
      if (c2 == std::string_view::npos) continue;
      uint64_t nth = 0, code = 0;
      if (!ParseUnsigned(item.substr(c1 + 1, c2 - c1 - 1), &nth) ||
          !ParseUnsigned(item.substr(c2 + 1), &code) || nth > 1000000) {
        continue;
      }
      SetFault(s, item.substr(0, c1), static_cast<unsigned int>(nth), static_cast<CUresult>(code));
    }
  }
}

void* ReserveAnywhere(size_t size, size_t align) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (align < page) align = page;
  if (size > SIZE_MAX - align) return nullptr;
  size_t span = size + align - page;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = RoundUp(start, align);
  if (aligned > start) munmap(raw, aligned - start);
  uintptr_t end = start + span;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  return reinterpret_cast<void*>(aligned);
}

bool Unreserve(uintptr_t addr, size_t size) {
  void* p = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

bool RangeAccessible(State& s, uintptr_t p, size_t n, bool write) {
  if (p == 0 || n == 0 || p + n < p) return false;
  if (auto it = FindContaining(s.legacy, p); it != s.legacy.end()) {
    return n <= it->second.size - (p - it->first);
  }
  if (auto it = FindContaining(s.imports, p); it != s.imports.end()) {
    return n <= it->second.size - (p - it->first);
  }
  uintptr_t cur = p;
  const uintptr_t end = p + n;
  while (cur < end) {
    auto it = FindContaining(s.mappings, cur);
    if (it == s.mappings.end()) return false;
    const Mapping& m = it->second;
    uintptr_t map_end = it->first + m.size;
    uintptr_t stop = end < map_end ? end : map_end;
    for (size_t g = (cur - it->first) / kGranularity; it->first + g * kGranularity < stop; ++g) {
      uint16_t bits = m.access[g];
      bool ok = false;
      for (int d = 0; d < kMaxDevices; ++d) {
        unsigned f = (bits >> (2 * d)) & 3u;
        if (write ? f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE : f != 0) ok = true;
      }
      if (!ok) return false;
    }
    cur = stop;
  }
  return true;
}

void MaybeFreeHandle(State& s, std::map<CUmemGenericAllocationHandle, PhysHandle>::iterator it) {
  PhysHandle& h = it->second;
  if (h.user_refs > 0 || h.map_refs > 0) return;
  if (h.fd >= 0) close(h.fd);
  if (!h.imported) s.used_mem -= h.size;
  s.handles.erase(it);
}

int MakeMemfd(const std::string& name, size_t size) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace simcuda

using simcuda::St;

extern "C" int simcuda_get_stats(SimCudaStats* stats) {
  if (stats == nullptr) return -1;
  simcuda::State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  stats->live_allocations = s.handles.size();
  stats->mappings = s.mappings.size();
  stats->reservations = s.reservations.size();
  stats->legacy_allocations = s.legacy.size();
  stats->legacy_imports = s.imports.size();
  uint64_t fds = 0;
  for (const auto& [value, h] : s.handles) fds += h.fd >= 0 ? 1 : 0;
  for (const auto& [base, a] : s.legacy) fds += a.fd >= 0 ? 1 : 0;
  stats->open_fds = fds;
  return 0;
}

extern "C" int simcuda_inject_failure(const char* name, unsigned int nth, int code) {
  if (name == nullptr || name[0] == '\0') return -1;
  simcuda::State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  simcuda::SetFault(s, name, nth, static_cast<CUresult>(code));
  return 0;
}

namespace {

// The calls that honour a delay (each calls DelayIfAsked or DelayAfterIfAsked):
// a delay asked of any other would never come, and a test that waits on it
// would pass or fail for the wrong reason.
bool Delayable(const char* name, bool after) {
  static constexpr const char* kBefore[] = {
      "cuMemMap", "cuMemUnmap", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"};
  if (name == nullptr) return false;
  if (after) return std::strcmp(name, "cuMemExportToShareableHandle") == 0;
  for (const char* known : kBefore) {
    if (std::strcmp(name, known) == 0) return true;
  }
  return false;
}

}  // namespace

extern "C" int simcuda_inject_delay(const char* name, unsigned int nth, unsigned int ms) {
  if (!Delayable(name, false) || nth == 0 || ms == 0 || ms > 60000) return -1;
  simcuda::State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  s.delays.push_back({name, nth, ms});
  return 0;
}

extern "C" int simcuda_inject_delay_after(const char* name, unsigned int nth, unsigned int ms) {
  if (!Delayable(name, true) || nth == 0 || ms == 0 || ms > 60000) return -1;
  simcuda::State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  s.delays.push_back({name, nth, ms, true});
  return 0;
}

extern "C" void simcuda_clear_failures(void) {
  simcuda::State& s = St();
  std::lock_guard<std::mutex> lock(s.mu);
  s.faults.clear();
  s.delays.clear();
}
