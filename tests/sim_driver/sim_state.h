// Simulated CUDA driver: the process-wide state tables and the helpers every operation shares.
//
// Host memory stands in for device memory: a physical chunk is a memfd, a reservation is a
// PROT_NONE anonymous mapping, a cuMemMap is a MAP_SHARED|MAP_FIXED mapping of the chunk's memfd,
// and a device pointer is the host address. All tables live here, guarded by one mutex (State::mu);
// the operations (sim_*.cc) lock it, check, then change the tables and the address space together.
#ifndef VMMIPC_TESTS_SIM_DRIVER_SIM_STATE_H_
#define VMMIPC_TESTS_SIM_DRIVER_SIM_STATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sim_api.h"

// The opaque context type of cuda.h, completed here.
struct CUctx_st {
  int device;
};

namespace simcuda {

inline constexpr size_t kGranularity = size_t{2} << 20;   // 2 MiB, as measured on the H200
inline constexpr size_t kHintMinSize = size_t{64} << 20;  // smaller reservations ignore hints
inline constexpr uintptr_t kUserTop = 0x7ffffffff000ULL;  // x86-64 4-level TASK_SIZE
inline constexpr int kMaxDevices = 8;
inline constexpr int kDriverVersion = 13000;
inline constexpr char kLegacyMagic[8] = {'S', 'I', 'M', 'L', 'E', 'G', '0', '1'};
inline constexpr char kVmmMemfdPrefix[] = "simcuda-vmm-d";  // memfd name: simcuda-vmm-d<dev>-<id>
inline constexpr char kLegacyMemfdPrefix[] = "simcuda-legacy-";

// A CUmemGenericAllocationHandle: one physical chunk as seen through one handle value. Imports get
// their own entry (and their own dup of the fd) even when they name the same memfd.
struct PhysHandle {
  int fd = -1;
  size_t size = 0;
  CUmemAllocationProp prop{};  // what GetAllocationPropertiesFromHandle reports
  bool imported = false;
  bool posix_exportable = false;  // created with the POSIX type, or imported from an fd
  uint64_t user_refs = 0;         // cuMemCreate / import / retain minus cuMemRelease
  uint64_t map_refs = 0;          // live mappings of this handle
  uint64_t block_id = 0;
};

struct Reservation {
  size_t size = 0;
};

// One cuMemMap call's range. access holds, per 2 MiB granule, 2 bits per device
// (CUmemAccess_flags); the CPU protection is the union over devices.
struct Mapping {
  size_t size = 0;
  size_t offset = 0;
  CUmemGenericAllocationHandle handle = 0;
  uint64_t buffer_id = 0;
  std::vector<uint16_t> access;
};

// A cuMemAlloc allocation in the process that made it.
struct LegacyAlloc {
  size_t size = 0;         // as requested
  size_t mapped_size = 0;  // rounded up to the granularity
  int fd = -1;             // memfd kept open: importers open /proc/<pid>/fd/<fd>
  int device = 0;
  uint64_t id = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
};

// A cuIpcOpenMemHandle mapping in an importing process.
struct LegacyImport {
  size_t size = 0;
  size_t mapped_size = 0;
  uint64_t refs = 0;
  uint32_t pid = 0;
  uint64_t id = 0;
  uint64_t token = 0;
  int device = 0;
  uint64_t buffer_id = 0;
};

struct Fault {
  std::string name;
  unsigned int countdown = 0;
  CUresult code = CUDA_SUCCESS;
};

// A delay of its own type: milliseconds past CUresult's range (1024 and up)
// are not a value of that enum.
struct Delay {
  std::string name;
  unsigned int countdown = 0;
  unsigned int ms = 0;
  bool after = false;  // simcuda_inject_delay_after: once the call's work is done
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int device_count = 1;  // devices this process sees (after CUDA_VISIBLE_DEVICES)
  // The host's index of each visible device: CUDA_VISIBLE_DEVICES=2 makes
  // host GPU 2 this process's device 0 (its PCI address says which it is).
  int host_index[kMaxDevices] = {0, 1, 2, 3, 4, 5, 6, 7};
  size_t total_mem = size_t{16} << 30;
  size_t used_mem = 0;
  uint64_t next_handle = 0x5100000000000001ULL;
  uint64_t next_id = 1;
  uint64_t token = 0;  // random per process, in every legacy handle it makes
  int ctx_retains[kMaxDevices] = {};
  CUctx_st primary_ctx[kMaxDevices] = {};

  std::map<CUmemGenericAllocationHandle, PhysHandle> handles;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, LegacyAlloc> legacy;
  std::map<uintptr_t, LegacyImport> imports;
  std::vector<Fault> faults;
  std::vector<Delay> delays;
  // The driver's teardown at exit (TearDownAtExit, registered by cuInit):
  // the calls waiting in an injected delay then, and whether it has run.
  int delayed_calls = 0;
  bool torn_down = false;
};

// The one state object: built on first use, never destroyed (safe in atexit handlers).
State& St();

// The driver's teardown as the process exits, registered with std::atexit by
// the first cuInit that succeeds (as the driver registers its own): a call in
// progress then (one waiting in an injected delay) crashes the real driver,
// so this writes "simcuda: torn down at exit while N call(s) were in
// progress" to stderr and ends the process with status 139, as a SIGSEGV
// would; calls after it answer CUDA_ERROR_DEINITIALIZED.
void TearDownAtExit();

// The calling thread's current context (nullptr if none).
CUcontext& CurrentCtx();
std::vector<CUcontext>& CtxStack();

// Entry checks, under St().mu. CheckInit returns NOT_INITIALIZED before a successful cuInit.
CUresult CheckInit(const State& s);
// CheckInit, then the pending injected fault for `name`, if it fires now.
CUresult Enter(State& s, const char* name);
// Waits the injected delay for `name` if it fires now (simcuda_inject_delay).
// Takes s.mu itself: call it without holding it.
void DelayIfAsked(State& s, const char* name);
// The same for a delay asked to come after the call's work (simcuda_inject_delay_after).
void DelayAfterIfAsked(State& s, const char* name);
bool ValidDevice(const State& s, int dev);
// The device of the current context, or -1 if the thread has none.
int CurrentDevice(const State& s);

// Reads SIMCUDA_* variables (device count, total memory, faults) into s; called by cuInit.
void LoadEnvironment(State& s);

// Interval lookups: the entry whose [base, base + size) contains addr, or end().
template <typename Map>
typename Map::iterator FindContaining(Map& m, uintptr_t addr) {
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return m.end();
  --it;
  if (addr - it->first < it->second.size) return it;
  return m.end();
}
// Whether any entry intersects [base, base + size).
template <typename Map>
bool AnyOverlap(const Map& m, uintptr_t base, size_t size) {
  auto it = m.lower_bound(base);
  if (it != m.end() && it->first < base + size) return true;
  if (it == m.begin()) return false;
  --it;
  return it->first + it->second.size > base;
}

// Address-space helpers. ReserveAnywhere maps PROT_NONE anonymous NORESERVE memory of `size` at an
// address aligned to `align` (a power of two >= page size); nullptr on failure.
void* ReserveAnywhere(size_t size, size_t align);
// Puts [addr, addr + size) back to reserved PROT_NONE anonymous NORESERVE memory.
bool Unreserve(uintptr_t addr, size_t size);

// Whether [p, p + n) is device memory the caller may read (write = false) or write (write = true)
// through a driver copy: inside one cuMemAlloc allocation or legacy import, or covered by
// contiguous VMM mappings whose access allows it.
bool RangeAccessible(State& s, uintptr_t p, size_t n, bool write);

// Drops one user reference or mapping reference; frees the handle (fd, memory accounting) once
// neither is left.
void MaybeFreeHandle(State& s, std::map<CUmemGenericAllocationHandle, PhysHandle>::iterator it);

// memfd_create(name, MFD_CLOEXEC) + ftruncate(size); -1 on failure.
int MakeMemfd(const std::string& name, size_t size);

inline bool IsAligned(uint64_t v, uint64_t a) { return (v & (a - 1)) == 0; }
inline size_t RoundUp(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace simcuda

#endif  // VMMIPC_TESTS_SIM_DRIVER_SIM_STATE_H_
